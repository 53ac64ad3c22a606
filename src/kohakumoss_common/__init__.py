"""Shared foundations for every KohakuMoss package: errors, logging, safetensors io, hashing, device info, paths.

Imports nothing from the other KohakuMoss packages.
"""
