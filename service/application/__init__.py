"""The application layer: the study service that the REST API and the CLI both answer through, and its records."""
