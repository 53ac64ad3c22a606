"""The situ_glu op: MOSS-Image's gated activation on a fused [hidden | gate] projection."""
