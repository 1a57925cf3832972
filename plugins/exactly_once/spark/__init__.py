"""The worker: the Spark job of one attempt (job.py, increment.py), reading and parsing,
the staging writes with record isolation, row checks, transforms, the code archive, the
runners that start the job (spark-submit, Spark Connect) and the job's settings. Imports the
ledger (to read the attempt's place and run its staging functions) and the shared modules,
nothing above."""
