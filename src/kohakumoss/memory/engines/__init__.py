"""Memory engines: each installs itself on a backbone and is checked against the plain path."""
