"""The spark-submit entry of one checkpoint attempt (`exactly_once.spark.job` says what it does):

    spark-submit --py-files CODE.zip jobs/increment.py --pipeline NAME --checkpoint-id N --attempt T --settings FILE \
        --report FILE

The library and the pipeline's transform come from the code archive the submitting task
builds (`exactly_once.spark.shipping`), on the driver and on every executor.
"""

import sys

from exactly_once.spark.job import main

if __name__ == "__main__":
    sys.exit(main())
