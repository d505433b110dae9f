"""Ways to plug grammarmask into an engine: a reference engine loop, Hugging Face transformers."""
