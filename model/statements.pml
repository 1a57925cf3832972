/* The ledger's statements, each a transaction or a step of one: the commit, recovery,
   leases and planning (model/ledger.pml includes it). */

/* -- statements shared by several steps ---------------------------------------------------- */

/* delete_staging (attempt a, or all when 0). The staging trigger refuses a delete of a
   pre-committed attempt's rows while the checkpoint awaits its commit: the ledger never tries one. */
inline delete_staging(c, a) {
    assert(!(awaits_commit(c) && (a == 0 || a == cp[c].pre) && cp[c].rows[cp[c].pre] > 0));
    i = 0;
    do
    :: i < A -> if :: a == 0 || a == i -> cp[c].rows[i] = 0 :: else -> skip fi; i++
    :: else -> break
    od
}

/* end_attempts: the checkpoint's attempts still in `from` (one, or all when a == 0). */
inline end_attempts(c, a, from, to) {
    i = 1;
    do
    :: i < A -> if :: (a == 0 || a == i) && cp[c].att[i] == from -> ATTEMPT_TRANSITION(end_attempts, c, i, from, to)
                   :: else -> skip fi; i++
    :: else -> break
    od
}

inline mark_stalled(c) {
    TRANSITION(mark_stalled, c, IN2(c, planned, running), stalled);
    events++; cp[c].stalled_at = events
}

/* Ledger.release: its ranges go to the next plan. */
inline release(c) {
    TRANSITION(mark_aborted, c, IN3(c, planned, running, stalled), aborted);
    cp[c].released = true;
    end_attempts(c, 0, running, aborted);
    delete_staging(c, 0)
}

/* -- phase two (exactly_once.ledger.commit, promotion) ------------------------------------- */

inline promote(c) {
    i = 0;
    do
    :: i < K -> if
                :: cp[c].range & BIT(i) ->
                   if
                   :: cp[c].replays == 0 -> committed_ranges[i]++; counted[i] = counted[i] + promoted   /* promote_ranges */
                   :: else ->   /* contributions replaced: exactly what the final tables hold of the slot, never a folded one's */
                      assert(!cp[slot(c)].folded && counted[i] == contribution[slot(c)]);
                      counted[i] = counted[i] - contribution[slot(c)] + promoted
                   fi;
                   rows_version[i] = cp[c].version;
                   assert(committed_ranges[i] <= 1 && counted[i] <= 1)   /* no offset committed twice */
                :: else -> skip
                fi; i++
    :: else -> break
    od;
    contribution[slot(c)] = promoted;
    latest_version[slot(c)] = cp[c].version;
    TRANSITION(mark_committed, c, IN2(c, precommitted, stalled), committed);
    ATTEMPT_TRANSITION(end_attempts, c, cp[c].pre, precommitted, committed)
}

/* Ledger.commit; outcome: 1 committed (or was), 2 sent back, 3 stalled, 0 failed (a retry may do), 4 not pre-committed. */
inline commit(c) {
    outcome = 4;
    lock_row(c);
    if
    :: cp[c].state == committed -> atomic { delete_staging(c, 0); outcome = 1; end_transaction() }
    :: !awaits_commit(c) -> atomic { end_transaction() }   /* NotPreCommitted */
    :: else ->
       atomic { pre = cp[c].pre; count = cp[c].rows[pre] }   /* staged_summary */
       if
       :: count == cp[c].staged ->
          CRASH;   /* fault: commit.before_promote */
          if
          :: cp[c].replays == 0 -> atomic { !commits_alone -> commits_shared++; held_commits = 1 }   /* lock_commits */
          :: else -> atomic { !commits_alone && commits_shared == 0 -> commits_alone = true; held_commits = 2 }   /* lock_commits_alone */
          fi;
          promoted = cp[c].rows[pre];   /* the promotion's INSERT ... SELECT: a read of its own */
          if
          :: refusals > 0 && faulty -> atomic { refusals--; end_transaction(); outcome = 2 }   /* PromotionRefused */
          :: db_errors > 0 && faulty -> atomic { db_errors--; end_transaction(); outcome = 0 }   /* no record's error */
          :: true ->
             CRASH;   /* fault: commit.before_commit */
             atomic {
                 assert(promoted == cp[c].staged && pre == cp[c].pre);   /* only the pre-committed attempt's counted rows */
                 promote(c);
                 outcome = 1;
                 end_transaction()
             }
             CRASH;   /* fault: commit.before_clean_up */
             atomic { cp[c].locker == NOBODY -> delete_staging(c, 0) }
             CRASH   /* fault: commit_task.try*.after_commit */
          fi
       :: else -> atomic { end_transaction(); outcome = 2 }   /* StagedDataChanged */
       fi
    fi;
    if
    :: outcome == 2 -> send_back(c, pre)
    :: outcome == 0 -> record_commit_failure(c)
    :: else -> skip
    fi
}

/* commit._send_back: planned again, its lease ended now. */
inline send_back(c, a) {
    atomic {
        cp[c].locker == NOBODY ->
        if
        :: awaits_commit(c) ->
           TRANSITION(mark_planned, c, IN2(c, precommitted, stalled), planned);
           cp[c].pre = 0; cp[c].staged = 0; cp[c].lease_ok = false;
           ATTEMPT_TRANSITION(end_attempts, c, a, precommitted, aborted);
           cp[c].failures++;
           delete_staging(c, 0)
        :: else -> skip
        fi;
        end_transaction()
    }
}

/* commit._record_failure: stalled at once if no retry fixes the cause, after STALL_AFTER if one may. */
inline record_commit_failure(c) {
    atomic {
        cp[c].locker == NOBODY ->
        if
        :: awaits_commit(c) ->
           cp[c].commit_failures++;
           if
           :: cp[c].state == stalled || cp[c].commit_failures >= STALL_AFTER ->
              TRANSITION(record_commit_failure, c, IN2(c, precommitted, stalled), stalled); outcome = 3
           :: cp[c].state == precommitted ->   /* a cause no retry fixes */
              TRANSITION(record_commit_failure, c, IN2(c, precommitted, stalled), stalled); outcome = 3
           :: cp[c].state == precommitted && cp[c].commit_failures < STALL_AFTER -> skip   /* transient */
           fi;
           if :: outcome == 3 -> events++; cp[c].stalled_at = events :: else -> skip fi
        :: else -> skip
        fi;
        end_transaction()
    }
}

/* -- recovery (Ledger.recover) and leases (exactly_once.ledger.leases) ------------------------ */

inline expire(c) {
    atomic {
        cp[c].locker == NOBODY ->
        if
        :: IN2(c, planned, running) && !cp[c].lease_ok ->
           expired = 1; j = 0;   /* lease_expiries */
           do
           :: j < C -> if :: cp[j].state == aborted && cp[j].lease_expired && (cp[j].range & cp[c].range) -> expired++
                          :: else -> skip fi; j++
           :: else -> break
           od;
           if
           :: expired < STALL_AFTER -> release(c); cp[c].lease_expired = true
           :: else -> end_attempts(c, 0, running, aborted); delete_staging(c, 0); mark_stalled(c)
           fi
        :: else -> skip
        fi;
        end_transaction()
    }
}

inline recover(own) {
    atomic {   /* recoverable: one read */
        found = 0; j = 0;
        do
        :: j < C -> if
                    :: cp[j].state == precommitted ||
                       (IN2(j, planned, running) && !cp[j].lease_ok && cp[j].dag_run != own) -> found = found | BIT(j)
                    :: else -> skip fi; j++
        :: else -> break
        od
    }
    do   /* each one found: committed, or expired, each in a transaction of its own */
    :: found == 0 -> break
    :: else ->
       atomic { k = 0; do :: !(found & BIT(k)) -> k++ :: else -> break od; found = found & ~BIT(k) }
       if :: cp[k].state == precommitted -> commit(k) :: else -> expire(k) fi
    od;
    atomic {   /* delete_stale_staging: one statement */
        j = 0;
        do
        :: j < C -> i = 1;
                    do
                    :: i < A -> if
                                :: !(cp[j].state == running && cp[j].attempt == i) &&
                                   !(IN2(j, precommitted, stalled) && cp[j].pre == i) -> cp[j].rows[i] = 0
                                :: else -> skip fi; i++
                    :: else -> break
                    od; j++
        :: else -> break
        od
    }
}

/* -- begin (Ledger.begin: refuse while stalled, recover, plan) --------------------------------- */

inline refuse_if_stalled(own) {
    atomic {
        refused = false; j = 0;
        do
        :: j < C -> if :: cp[j].state == stalled && cp[j].dag_run != own -> refused = true :: else -> skip fi; j++
        :: else -> break
        od
    }
}

/* planning.plan_checkpoint: released ranges whole, then the unclaimed offsets of its reach. */
inline plan(own, first, last) {
    lock_pipeline();
    atomic {   /* checkpoint_of_run */
        c = NOBODY; j = 0;
        do
        :: j < checkpoints -> if :: cp[j].dag_run == own && cp[j].replays == 0 -> c = j :: else -> skip fi; j++
        :: else -> break
        od
    }
    if
    :: c == NOBODY ->
       atomic {   /* taken_ranges */
           taken = 0; j = 0;
           do
           :: j < checkpoints -> if :: cp[j].replays == 0 && !cp[j].released -> taken = taken | cp[j].range
                                    :: else -> skip fi; j++
           :: else -> break
           od
       }
       atomic {   /* released_ranges */
           released = 0; j = 0;
           do
           :: j < checkpoints -> if :: cp[j].released && !cp[j].replanned -> released = released | BIT(j)
                                    :: else -> skip fi; j++
           :: else -> break
           od
       }
       CRASH;   /* fault: begin.before_commit */
       atomic {
           j = 0;   /* a stall older than this run fails it (promise 9) */
           do
           :: j < C -> assert(!(cp[j].state == stalled && cp[j].stalled_at <= began && cp[j].dag_run != own)); j++
           :: else -> break
           od;
           c = checkpoints; checkpoints++;
           cp[c].dag_run = own; cp[c].version = 1; cp[c].lease_ok = true;
           i = (first > frontier -> first : frontier);
           do
           :: i < last -> if :: !(taken & BIT(i)) -> cp[c].range = cp[c].range | BIT(i) :: else -> skip fi; i++
           :: else -> break
           od;
           j = 0;
           do
           :: j < C -> if
                       :: released & BIT(j) -> cp[j].replanned = true; cp[c].range = cp[c].range | cp[j].range   /* mark_replanned */
                       :: else -> skip fi; j++
           :: else -> break
           od;
           i = frontier;   /* advance_frontier */
           do
           :: i < K && ((taken | cp[c].range) & BIT(i)) -> i++
           :: else -> break
           od;
           frontier = i;
           if
           :: cp[c].range == 0 -> TRANSITION(insert_checkpoint, c, IN1(c, none), committed)
           :: else -> TRANSITION(insert_checkpoint, c, IN1(c, none), planned)
           fi;
           end_transaction()
       }
    :: else -> atomic { end_transaction() }
    fi
}

#define replayable(j) (cp[j].state == committed && cp[j].range != 0 && cp[j].replays == 0)

/* replays.reprocess: a checkpoint that replays a committed one's ranges, with a later configuration. */
inline plan_reprocessing(own) {
    lock_pipeline();
    atomic {
        c = NOBODY; j = 0;
        do
        :: j < checkpoints -> if :: cp[j].dag_run == own -> c = j :: else -> skip fi; j++   /* open_reprocessing, this run's */
        :: else -> break
        od;
        /* a retry finds its open reprocessing before the horizon is checked: begun inside it, it
           goes on, and no fold takes its checkpoint while it is open */
        if
        :: c == NOBODY ->
           j = 0;   /* the checkpoint it names: the first committed one (with retention, any) */
           do
           :: j < checkpoints && !replayable(j) -> j++
           :: j < checkpoints && replayable(j) && PRUNE -> j++   /* it names a later one */
           :: j >= checkpoints || replayable(j) -> break
           od;
           if
           :: j < checkpoints && (cp[j].beyond || cp[j].folded) -> j = NOBODY   /* NotReprocessable: beyond the horizon, or folded */
           :: j < checkpoints && !cp[j].beyond && !cp[j].folded && checkpoints < C -> skip
           :: else -> j = NOBODY   /* nothing committed to reprocess yet */
           fi
        :: else -> j = NOBODY
        fi;
        if :: j == NOBODY -> end_transaction() :: else -> skip fi
    }
    if
    :: j != NOBODY ->   /* insert_reprocessing, its transaction's commit: a step of its own after the checks */
       atomic {
           c = checkpoints; checkpoints++;
           cp[c].dag_run = own; cp[c].version = 2; cp[c].lease_ok = true; cp[c].replays = j + 1; cp[c].range = cp[j].range;
           TRANSITION(insert_reprocessing, c, IN1(c, none), planned);
           end_transaction()
       }
    :: else -> skip
    fi
}
