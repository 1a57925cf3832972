"""The publisher of kafka sinks (exactly_once.sinks.kafka): committed outbox rows to Kafka,
exactly once, without a Kafka transaction that outlives a process or waits on PostgreSQL.

    progress.py      where publishing stands: the progress record kept in Kafka, and the
                     verdict on it against the database (a restored database stalls)
    publisher.py     the loop: fence earlier publishers, reconcile, publish in short Kafka
                     transactions that carry their own progress, prune what Kafka has
    transactions.py  one such transaction: the sink's producer, a batch of records and its
                     progress committed, or aborted naming the first row Kafka refused
    refusals.py      what a Kafka error means: a record refused (isolated by halving its
                     batch), the topic refused, a fence, or a blip a retry may pass
"""
