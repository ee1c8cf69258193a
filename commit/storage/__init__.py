"""Object stores (local disk, S3 sync and async) and shared AWS clients. Imports nothing else of lancetx."""
