"""infertune.tuner: profile, search and prove a serving configuration (no Kubernetes here)."""
