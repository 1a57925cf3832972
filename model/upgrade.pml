/* A checkpoint pre-committed before an upgrade, its staged rows in a staging table under the
   earlier name (`stg_<pipeline>_<sink>`), and the steps that may meet it first, in every order
   (plugins/exactly_once/sql/migrations/0017_staging_under_earlier_names_adopted.sql, exactly_once.orchestration.tasks,
   exactly_once.ledger.commit), modelled for spin:

   - its run's commit task (TRIES tries): migrate_through (its own transaction, under the
     migrators' advisory lock; 0017 moves every pipeline's rows to today's `stg<n>_…` table,
     creating it if missing), then Ledger.commit: the checkpoint's row FOR UPDATE, the staged
     rows counted (staged_summary, under today's name), promoted, committed;
   - a later run's begin: migrate_through, refused while a checkpoint is stalled, recovery
     (which commits a pre-committed checkpoint);
   - errors of the commit no record causes (DB_ERRORS): counted, stalled after STALL_AFTER, or
     at once for a cause no retry fixes (commit._record_failure);
   - at the end, an operator who clears the commit task of a stalled checkpoint.

   Properties: the commit never reads staging under a name the rows are not in (before 0017
   ran in the commit task it read today's name: 42P01, or an empty table of today's name, and
   the checkpoint stalled, or was sent back and its pre-commit discarded); the checkpoint is
   committed once, by its pre-committed attempt's rows as counted at pre-commit; a stalled
   checkpoint is committed only by an operator's cleared task (a try of its own run that began
   before the stall and ran late does not resume it: Checkpoint.resumed_by, migration 0020);
   after the operator, it is committed.

   Bounds: MIGRATE_FIRST (0: the commit task commits without migrating, as before issue 60),
   RESUME_AFTER_STALL (0: any try resumes a stalled checkpoint, as before 0020), TODAY_EXISTS
   (today's table: 0 missing, 1 registered already, 2 either), DB_ERRORS, CRASHES. */

#ifndef MIGRATE_FIRST
#define MIGRATE_FIRST 1
#endif
#ifndef RESUME_AFTER_STALL
#define RESUME_AFTER_STALL 1
#endif
#ifndef TODAY_EXISTS
#define TODAY_EXISTS 2
#endif
#ifndef DB_ERRORS
#define DB_ERRORS 0
#endif
#ifndef CRASHES
#define CRASHES 0
#endif
#define STALL_AFTER 2
#define TRIES 2
#define STAGED 1          /* the copies of its rows the pre-commit counted */
#define NOBODY 255

mtype = { precommitted, stalled, committed };

mtype state = precommitted;
byte rows_earlier = STAGED;   /* its staged rows, under the earlier name */
byte rows_today;              /* ... and under today's */
bool today_exists;
bool migrated;                /* 0017 applied (plugins/exactly_once/sql/migrations, once, under the migrators' lock) */
byte locker = NOBODY;         /* the checkpoint's row, FOR UPDATE */
byte commit_failures;
byte stalled_at;              /* ghost: when it stalled (events) */
byte events = 1;              /* ghost clock of stalls and tries */
byte counted;                 /* copies of its rows promoted into the final tables */
byte db_errors = DB_ERRORS;
byte crashes = CRASHES;
bool final_try;               /* the operator's, with no fault */

#define faulty (!final_try)
#define CRASH if :: crashes > 0 && faulty -> crashes--; goto crashed :: true -> skip fi

/* migrate_through: pending migrations in one transaction, concurrent migrators wait. */
inline migrate() {
    atomic {
        if
        :: !migrated ->   /* 0017: every pipeline's rows moved to today's names */
           today_exists = true; rows_today = rows_today + rows_earlier; rows_earlier = 0; migrated = true
        :: else -> skip
        fi
    }
}

/* Ledger.commit (resume: a task's try number `try` that began at `began`, an operator's if
   `cleared`); outcome: 1 committed (or was), 0 failed (a retry may do), 3 stalled. */
inline commit(began, try, cleared) {
    atomic { locker == NOBODY -> locker = _pid }
    if
    :: state == committed -> outcome = 1
#if RESUME_AFTER_STALL
    :: state == stalled && (began < stalled_at || try == 1) -> outcome = 3   /* Stalled: not resumed_by */
#endif
    :: else ->
       /* staged_summary: today's name */
       assert(today_exists && rows_today == STAGED && rows_earlier == 0);   /* never a name the rows are not in */
       count = rows_today;
       if
       :: db_errors > 0 && faulty ->   /* the commit fails for no record's fault: _record_failure */
          atomic {
              db_errors--; commit_failures++;
              if
              :: state == stalled || commit_failures >= STALL_AFTER -> state = stalled
              :: state == precommitted -> state = stalled   /* a cause no retry fixes */
              :: state == precommitted && commit_failures < STALL_AFTER -> skip   /* transient */
              fi;
              if :: state == stalled -> outcome = 3; events++; stalled_at = events :: else -> outcome = 0 fi
          }
       :: true ->
          atomic {   /* promotion, the ranges recorded, committed */
              assert(count == STAGED && rows_today == count);   /* the pre-committed attempt's counted rows */
              assert(state == precommitted || cleared);   /* a stall is left only by an operator's act */
              counted = counted + rows_today; state = committed; outcome = 1;
              assert(counted == STAGED)   /* once */
          }
       fi
    fi;
    atomic { locker = NOBODY }
}

/* The checkpoint's run's commit task: commit_checkpoint, TRIES tries. */
proctype CommitTask(bool cleared) {
    byte try, began, count, outcome;
    try = (cleared -> 1 : 0);   /* a cleared task's tries are numbered after its run's last */
next:
    atomic { try++; if :: try > TRIES -> goto ended :: else -> skip fi; began = events }
    CRASH;   /* a crash anywhere: the try ends, Airflow runs the next */
#if MIGRATE_FIRST
    migrate();
    CRASH;
#endif
    commit(began, try, cleared);
    if
    :: outcome == 0 -> goto next   /* retried */
    :: else -> goto ended   /* committed; Stalled fails the task without retry */
    fi;
crashed:
    atomic { locker = (locker == _pid -> NOBODY : locker) }
    goto next;
ended:
    skip
}

/* A later run's begin_checkpoint: migrate_through, refuse_if_stalled, Ledger.begin's recovery. */
proctype Begin() {
    byte count, outcome;
    CRASH;
    migrate();
    CRASH;
    if
    :: state == stalled -> goto crashed   /* refused: the stall named */
    :: state == precommitted -> commit(0, 0, false)   /* recovery commits it */
    :: else -> skip
    fi;
crashed:
    atomic { locker = (locker == _pid -> NOBODY : locker) }
}

init {
    atomic {
        if
        :: TODAY_EXISTS != 0 -> today_exists = true
        :: TODAY_EXISTS != 1 -> today_exists = false
        fi;
        run CommitTask(false);
        run Begin()
    }
    _nr_pr == 1;
    if   /* an operator clears the commit task of a stalled checkpoint */
    :: state == stalled -> final_try = true; run CommitTask(true); _nr_pr == 1
    :: else -> skip
    fi;
    /* a begin of a later run, no fault: its recovery commits what no task did */
    final_try = true; run Begin(); _nr_pr == 1;
    assert(state == committed && counted == STAGED)
}
