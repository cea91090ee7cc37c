"""HTTP serving: FastAPI app, routes, streaming driver, metrics."""
