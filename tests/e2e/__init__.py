"""End-to-end tests against the docker-compose cluster (see README.md here)."""
