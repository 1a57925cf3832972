-- An attempt that fails records whether a retry of it may succeed: the Spark job
-- knows (a wrong table or bad records under the `fail` policy will fail again),
-- and the task that submitted it reads the verdict here, whatever ran the job.
ALTER TABLE exactly_once.attempts ADD COLUMN retryable boolean;
