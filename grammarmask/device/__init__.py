"""The device side: masking logits with packed bitmasks (per device) and moving host masks
to the device (the CUDA side stream and its event)."""
