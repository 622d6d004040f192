"""The cluster API: talking to Kubernetes (two transports), and the job commands on top of it."""
