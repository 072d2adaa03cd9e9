"""MLflow, the one seam: what memsweep writes there, and the local tracking server it starts."""
