"""Command-line tools: kohakumoss-doctor, kohakumoss-config."""
