"""The publisher of kafka sinks (exactly_once.sinks.kafka): committed outbox rows to Kafka,
exactly once, without a Kafka transaction that outlives a process or waits on PostgreSQL.

    progress.py   where publishing stands: the progress record kept in Kafka, and the
                  verdict on it against the database (a restored database stalls)
    publisher.py  the loop: fence earlier publishers, reconcile, publish in short Kafka
                  transactions that carry their own progress, prune what Kafka has
"""
