"""The web service, its database, the dashboard and the command line. Never imports torch."""
