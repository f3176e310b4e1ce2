"""The retry service: intake, scheduler and the dead-letter store on PostgreSQL."""
