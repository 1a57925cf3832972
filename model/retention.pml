/* Retention (plugins/exactly_once/ledger/retention.py, plugins/exactly_once/sql/retention.sql): the
   reprocess horizon passing, and prune's bounded steps folding what lies beyond it, beside
   the runs' commits and a reprocessing (model/ledger.pml includes it).

   A step is one short transaction: the pipeline's lock (lock_pipeline, which a reprocessing's
   begin takes too), then a try of the commit lock alone (may_fold: while a commit holds it,
   the step folds nothing and never waits), then the oldest committed checkpoints beyond the
   horizon that no reprocessing is open for (foldable, FOR UPDATE; a batch of one here),
   their contributions folded into the base's (created by the first fold), folded_at set.

   Its properties, checked where they apply: a fold never happens while a reprocessing of
   the checkpoint is open (fold); the base then holds, for each offset it took, what the final
   tables hold (fold); no reprocessing of a folded checkpoint commits, and a reprocessing of
   one not folded takes back exactly what the final tables hold of it, so it stays exact
   (promote, model/statements.pml); and every offset still counts once (ledger.pml's end). */

/* The clock passes now - reprocess_horizon: every original committed so far is beyond it
   (time goes forward; a horizon between two commits is an interleaving where it passed
   before the later one). */
inline horizon_passes() {
    atomic {
        j = 0;
        do
        :: j < checkpoints -> if :: IN1(j, committed) && cp[j].replays == 0 && j != base -> cp[j].beyond = true
                                 :: else -> skip fi; j++
        :: else -> break
        od;
        j = 0
    }
}

/* foldable: the oldest committed original beyond the horizon, not folded, none of its
   reprocessings open. (Oldest by id: in the configurations with retention, which run one
   scheduled run after the checkpoint committed before, ids are in the order of commits.) */
inline foldable() {
    c = NOBODY; j = 0;
    do
    :: j < checkpoints && c == NOBODY ->
       if
       :: IN1(j, committed) && cp[j].replays == 0 && cp[j].beyond && !cp[j].folded ->
          c = j; i = 0;
          do
          :: i < checkpoints -> if :: cp[i].replays == j + 1 && !IN2(i, committed, aborted) -> c = NOBODY
                                   :: else -> skip fi; i++
          :: else -> break
          od
       :: else -> skip
       fi; j++
    :: else -> break
    od;
    i = 0; j = 0
}

/* base, fold_ranges, mark_folded (and the keyed sinks' contributions folded): one commit. */
inline fold(c) {
    j = 0;
    do
    :: j < checkpoints -> assert(!(cp[j].replays == c + 1 && !IN2(j, committed, aborted))); j++   /* none open */
    :: else -> break
    od;
    if
    :: base == NOBODY ->
       base = checkpoints; checkpoints++;
       cp[base].dag_run = BASE_RUN; cp[base].folded = true;
       TRANSITION(base, base, IN1(base, none), committed)
    :: else -> skip
    fi;
    i = 0;
    do
    :: i < K -> if
                :: cp[c].range & BIT(i) ->
                   base_rows[i] = base_rows[i] + contribution[c];
                   assert(base_rows[i] == counted[i])   /* the base holds what the final tables hold */
                :: else -> skip
                fi; i++
    :: else -> break
    od;
    contribution[c] = 0; cp[c].folded = true;
    i = 0; j = 0
}

/* The commit tasks' prune (one step each), and the clock passing the horizon, in any order. */
proctype Pruner() {
    byte c, i, j, steps = PRUNE, horizons = HORIZONS;
    byte held_row = NOBODY, held_commits;
    bool held_pipeline;
    do
    :: horizons > 0 -> atomic { horizons--; horizon_passes() }
    :: steps > 0 ->
       steps--;
       lock_pipeline();
       atomic {
           if
           :: !commits_alone && commits_shared == 0 ->   /* may_fold */
              commits_alone = true; held_commits = 2; foldable()
           :: else -> c = NOBODY   /* a commit runs: nothing folded this step */
           fi;
           if :: c == NOBODY -> end_transaction() :: else -> skip fi
       }
       if
       :: c != NOBODY -> atomic { cp[c].locker == NOBODY -> fold(c); end_transaction(); c = NOBODY }
       :: else -> skip
       fi
    :: horizons == 0 && steps == 0 -> break
    od
}
