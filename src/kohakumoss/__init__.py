"""kohakumoss."""
