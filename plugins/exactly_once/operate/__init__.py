"""What a person uses: status, the ways out of a stall, the pipelines view (its data, page
and app), the preflight, the scaffold of a new pipeline, the configuration reference.
Imports the worker, the ledger and the shared modules, nothing of the Airflow adapter."""
