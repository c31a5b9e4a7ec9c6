"""Triton compatibility: its model configuration (``config.pbtxt``) and protocol messages."""
