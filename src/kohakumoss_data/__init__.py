"""kohakumoss_data."""
