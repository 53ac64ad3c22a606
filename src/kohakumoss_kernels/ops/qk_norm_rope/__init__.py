"""The qk_norm_rope op: per-head RMSNorm then rotary embedding, one pass over q or k."""
