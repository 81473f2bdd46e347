"""Database backends of our own (``ENGINE`` values)."""
