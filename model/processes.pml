/* The processes: an attempt's steps, the Spark job, Airflow's tasks of a run, an operator,
   the clock (model/ledger.pml includes it). */

/* -- phase one: an attempt (tasks.run_increment, Ledger.start_attempt / pre_commit / abort_attempt) -- */

inline start_attempt(c) {
    a = 0;
    CRASH;   /* fault: start_attempt.before_commit (a crash rolls it back: as if it never ran) */
    atomic {
        cp[c].locker == NOBODY ->
        if
        :: is_open(c) && !awaits_commit(c) && cp[c].attempt < A - 1 ->
           TRANSITION(start_attempt, c, IN3(c, planned, running, stalled), running);
           cp[c].attempt++; a = cp[c].attempt; cp[c].lease_ok = true;
           end_attempts(c, 0, running, aborted);   /* superseded */
           ATTEMPT_TRANSITION(insert_attempt, c, a, none, running);
           delete_staging(c, 0)
        :: else -> skip   /* NotRunnable */
        fi;
        end_transaction()
    }
}

inline abort_attempt(c, a, for_good) {
    atomic {
        cp[c].locker == NOBODY ->
        if
        :: is_current(c, a) ->
           ATTEMPT_TRANSITION(end_attempts, c, a, running, aborted);
           cp[c].failures++; cp[c].permanent = for_good;
           delete_staging(c, a);
           if
           :: cp[c].permanent || cp[c].failures >= STALL_AFTER -> mark_stalled(c)   /* checkpoints.stalls */
           :: else -> TRANSITION(mark_planned, c, IN1(c, running), planned)
           fi
        :: else -> skip
        fi;
        end_transaction()
    }
}

inline pre_commit(c, a) {
    CRASH;   /* fault: pre_commit.before_commit (a crash rolls it back) */
    atomic {
        cp[c].locker == NOBODY ->
        ok = is_current(c, a); count = cp[c].rows[a];   /* checkpoint, locked; staged_summary */
        if
        :: ok && count == STAGED ->   /* the copies its job reported */
           TRANSITION(mark_precommitted, c, IN1(c, running), precommitted);
           cp[c].pre = a; cp[c].staged = count; cp[c].failures = 0;
           ATTEMPT_TRANSITION(end_attempts, c, a, running, precommitted)
        :: else -> ok = false   /* Fenced, StagingIncomplete */
        fi;
        end_transaction()
    }
}

/* One Spark task's INSERT into staging, and the staging trigger at its end: it waits for
   the checkpoint's row (FOR SHARE) and holds it to its commit, so one step. */
inline staging_write(c, a) {
    atomic {
        cp[c].locker == NOBODY ->
        if
        :: cp[c].pre == a && IN3(c, precommitted, stalled, committed) -> skip   /* frozen: refused */
        :: else -> cp[c].rows[a]++
        fi
    }
}

/* A duplicate of a task's write: the task retried after its write committed, or an
   executor declared lost but alive, at any later moment. */
proctype StagingWrite(byte c; byte a) {
    staging_write(c, a)
}

/* The Spark job of one attempt (exactly_once.spark.job), a process of its own that may
   outlive its task. Its rows go in one task write, which may be written twice. */
proctype Job(byte c; byte a) {
    if
    :: !is_current(c, a) -> cp[c].reported[a] = FENCED; goto done   /* Ledger.current: a read, no lock */
    :: else -> skip
    fi;
    /* fault: increment.before_read */
    /* fault: increment.before_write */
    staging_write(c, a);
    /* fault: increment.wrote.* */
    atomic { if :: duplicates > 0 && faulty -> duplicates--; run StagingWrite(c, a) :: true -> skip fi }
    if
    :: job_failures > 0 && faulty -> job_failures--; cp[c].reported[a] = FAILED_FOR_GOOD; goto done
    :: job_failures > 0 && faulty -> job_failures--; cp[c].reported[a] = FAILED; goto done
    :: true -> skip
    fi;
    /* fault: increment.before_pre_commit */
    atomic { if :: is_current(c, a) -> cp[c].reported[a] = STAGED :: else -> cp[c].reported[a] = FENCED fi }   /* the re-check after staging */
done:
    skip
}

/* -- Airflow's tasks of one DAG run (exactly_once.orchestration.tasks), each with TRIES tries ---- */

proctype Run(byte own; byte kind; byte first; byte last; byte target) {
    byte c = target, a, i, j, k, pre, count, promoted, outcome, expired, found, taken, released;
    byte phase = BEGIN, try, began;
    bool ok, refused, held_pipeline;
    byte held_row = NOBODY, held_commits;

    if :: kind == CLEARED -> phase = INCREMENT :: else -> skip fi;
    atomic { began = events; events++ }
next:
    atomic { try++; if :: try > TRIES -> goto failed :: else -> skip fi }
    if
    :: phase == BEGIN ->   /* begin_checkpoint */
       refuse_if_stalled(own);
       if :: refused -> goto failed :: else -> skip fi;
       recover(own);
       refuse_if_stalled(own);
       if :: refused -> goto failed :: else -> skip fi;
       if
       :: kind == REPROCESSING -> plan_reprocessing(own)
       :: kind == BACKFILL_RUN -> plan(own, first, last)   /* Reach.INTERVAL */
       :: else -> plan(own, 0, last)   /* Reach.BACKLOG: every unclaimed offset before its interval's end */
       fi;
       if :: c == NOBODY || cp[c].state == committed -> goto finished :: else -> skip fi;
       phase = INCREMENT; try = 0; goto next
    :: phase == INCREMENT ->   /* run_increment */
       start_attempt(c);
       if
       :: a == 0 ->   /* nothing to run: pre-committed or committed already, or aborted */
          if :: awaits_commit(c) || cp[c].state == committed -> phase = COMMIT; try = 0 :: else -> goto failed fi;
          goto next
       :: else -> skip
       fi;
       run Job(c, a);
       do   /* wait for the job, the heartbeat renewing the lease */
       :: cp[c].reported[a] != 0 -> break
       :: atomic { is_current(c, a) && !cp[c].lease_ok -> cp[c].lease_ok = true }   /* renew_lease */
       :: CRASH
       od;
       if
       :: cp[c].reported[a] == STAGED ->
          pre_commit(c, a);
          if :: !ok -> abort_attempt(c, a, false) :: else -> skip fi
       :: cp[c].reported[a] == FAILED -> abort_attempt(c, a, false)
       :: cp[c].reported[a] == FAILED_FOR_GOOD -> abort_attempt(c, a, true)
       :: cp[c].reported[a] == FENCED -> abort_attempt(c, a, false)
       fi;
       CRASH;   /* fault: increment_task.after_job */
       if
       :: cp[c].state == precommitted && cp[c].pre == a -> phase = COMMIT; try = 0
       :: cp[c].state == planned && cp[c].attempt == a -> skip   /* AttemptFailed: the next try */
       :: else -> goto failed   /* Fenced, Stalled */
       fi;
       goto next
    :: phase == COMMIT ->   /* commit_checkpoint */
       CRASH;   /* fault: commit_task.try* */
       commit(c);
       if
       :: outcome == 1 -> goto finished
       :: outcome == 0 -> goto next
       :: else -> goto failed   /* sent back, stalled, not pre-committed */
       fi
    fi;
crashed:
    atomic { end_transaction() }
    goto next;
failed:
finished:
    skip
}

/* An operator (exactly_once.operate.stalls): a stalled checkpoint's ranges released to the next
   run (retry), or its failed task cleared (a resume: a new attempt, or its commit tried again). */
proctype Operator() {
    byte c, i;
    byte held_row = NOBODY, held_commits;
    bool held_pipeline;
    atomic {   /* at any moment, if a checkpoint is stalled then */
        c = 0;
        do
        :: c < C && cp[c].state != stalled -> c++
        :: else -> break
        od
    }
    if
    :: c < C ->
       if
       :: lock_row(c);
          atomic {
              if :: cp[c].state == stalled -> release(c) :: else -> skip fi;   /* record_action retry */
              end_transaction()
          }
       :: run Run(cp[c].dag_run, CLEARED, 0, 0, c)
       fi
    :: else -> skip   /* nothing stalled when the operator looked */
    fi
}

/* Leases running out: a heartbeat that keeps failing, or a task that died. */
proctype Clock() {
    byte c;
    do
    :: expiries > 0 && faulty ->
       select (c : 0 .. C - 1);
       atomic { if :: IN2(c, planned, running) && cp[c].lease_ok -> cp[c].lease_ok = false; expiries-- :: else -> skip fi }
    :: break
    od
}
