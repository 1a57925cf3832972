/* The ledger's protocol (plugins/exactly_once/ledger/, plugins/exactly_once/sql/ledger.sql), modelled for spin.

   One partition of K offsets, all stable before the runs start. Each PostgreSQL
   transaction of the code is a sequence of steps: the locks it takes (FOR UPDATE on a
   checkpoint's row, FOR SHARE by the staging trigger, the advisory locks), each statement
   that reads (READ COMMITTED: a statement reads what is committed when it runs, so two
   statements are two reads), then one step that commits its writes. A process may crash
   at every fault point of exactly_once.faults (a comment "fault: NAME" marks each) and at
   every CRASH: its transaction rolls back and its locks go, Airflow runs the task's next
   try, and its Spark job, a process of its own, may live on as a zombie. Leases run out
   whenever the clock says so (a heartbeat that keeps failing). Scheduled runs, a backfill,
   a reprocessing and an operator interleave in every order.

   Every change of a checkpoint's or an attempt's state goes through TRANSITION or
   ATTEMPT_TRANSITION, named by the plugins/exactly_once/sql/ledger.sql statement that makes it;
   model/transitions.tsv lists them, and tests/model/test_model.py checks that the table,
   this file, plugins/exactly_once/sql/ledger.sql, the migrations' enums and the Python enums agree.

   Bounds (-D on spin's command line; tests/model/prove.py names the configurations):
   SECOND_RUN, BACKFILL, REPROCESS, OPERATOR (0 or 1 process each), PRUNE (retention's steps)
   and HORIZONS (model/retention.pml), budgets for faults
   over a whole execution (CRASHES, DUPLICATES, JOB_FAILURES, REFUSALS, DB_ERRORS,
   EXPIRIES), FINAL_ROUNDS, the fault-free runs after them, and COMMITTED_BEFORE, a checkpoint
   committed before the processes start. */

#include "state.pml"
#include "statements.pml"
#include "processes.pml"
#include "retention.pml"

/* After every process ended, no offset is stranded: each is committed once (by the
   rows of the latest configuration that processed it), or a later run takes it — held by
   an open or pre-committed checkpoint (recovery commits it, or aborts it once its lease
   ran out), by a stalled one (status reports it until an operator acts), released and not
   planned again, or not planned yet. With FINAL_ROUNDS, runs then go on without a fault,
   every lease run out and every stall retried by the operator, and every offset must
   count once. */
init {
    byte c, o, round, holder;
    atomic {
#if COMMITTED_BEFORE
        /* an earlier run's checkpoint of offset 0, committed (with retention: to be folded) */
        cp[0].dag_run = 9; cp[0].version = 1; cp[0].range = BIT(0); cp[0].state = committed; cp[0].attempt = 1;
        cp[0].pre = 1; cp[0].staged = STAGED; cp[0].att[1] = committed; checkpoints = 1; frontier = 1;
        committed_ranges[0] = 1; counted[0] = STAGED; rows_version[0] = 1; contribution[0] = STAGED; latest_version[0] = 1;
#endif
        run Run(1, SCHEDULED, 0, 1 + COMMITTED_BEFORE, NOBODY);   /* [0, 1), or [1, 2) after the earlier one */
#if SECOND_RUN
        run Run(2, SCHEDULED, 2, 3, NOBODY);
#endif
#if BACKFILL
        run Run(3, BACKFILL_RUN, 1, 2, NOBODY);
#endif
#if REPROCESS
        run Run(4, REPROCESSING, 0, 0, NOBODY);
#endif
#if OPERATOR
        run Operator();
#endif
#if PRUNE
        run Pruner();
#endif
        run Clock()
    }
    _nr_pr == 1;
    atomic {
    o = 0;
    do
    :: o < K ->
       assert(committed_ranges[o] <= 1 && counted[o] == committed_ranges[o]);
       holder = NOBODY; c = 0;
       do
       :: c < C -> if
                   :: cp[c].range & BIT(o) && cp[c].replays == 0 &&
                      (cp[c].state == committed || (cp[c].state != aborted && cp[c].state != none) ||
                       (cp[c].released && !cp[c].replanned)) -> holder = c
                   :: else -> skip fi; c++
       :: else -> break
       od;
       assert(holder != NOBODY || (o >= frontier && committed_ranges[o] == 0));   /* planned_offsets_stranded */
       if
       :: committed_ranges[o] == 1 -> assert(cp[holder].state == committed && rows_version[o] == latest_version[holder])
       :: else -> skip
       fi;
       o++
    :: else -> break
    od
    };
    atomic {   /* forget what no later step reads, so that end states that differ only there meet */
        final_runs = true; events = 0;
        c = 0;
        do
        :: c < C -> cp[c].stalled_at = 0; cp[c].commit_failures = 0; cp[c].failures = 0; cp[c].permanent = false;
                    o = 0; do :: o < A -> cp[c].reported[o] = 0; o++ :: else -> break od; c++
        :: else -> break
        od;
        c = 0; o = 0
    }
    do
    :: round < FINAL_ROUNDS ->
       atomic {
           c = 0;
           do
           :: c < C -> if :: IN2(c, planned, running) -> cp[c].lease_ok = false
                          :: IN1(c, stalled) -> TRANSITION(mark_aborted, c, IN3(c, planned, running, stalled), aborted);
                                                cp[c].released = true; o = 1;
                                                do :: o < A -> cp[c].rows[o] = 0; if :: cp[c].att[o] == running -> ATTEMPT_TRANSITION(end_attempts, c, o, running, aborted) :: else -> skip fi; o++ :: else -> break od
                          :: else -> skip fi; c++
           :: else -> break
           od
       }
       run Run(10 + round, SCHEDULED, 0, K, NOBODY);
       _nr_pr == 1;
       round++
    :: else -> break
    od;
    if
    :: FINAL_ROUNDS > 0 ->
       o = 0;
       do
       :: o < K ->
          holder = NOBODY; c = 0;
          do
          :: c < C -> if :: cp[c].state == committed && cp[c].replays == 0 && (cp[c].range & BIT(o)) -> holder = c :: else -> skip fi; c++
          :: else -> break
          od;
          assert(holder != NOBODY && committed_ranges[o] == 1 && counted[o] == 1);   /* no silent loss, none twice */
          assert(rows_version[o] == latest_version[holder]);   /* the latest processing's rows */
          o++
       :: else -> break
       od
    :: else -> skip
    fi
}
