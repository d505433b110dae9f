"""Bundled example schemas: realistic JSON Schemas for the demo, the check and the tests."""
