"""Varlen attention with the rotary embedding applied to q and k inside the kernel."""
