/* The ledger's state, its bounds, and the locks of PostgreSQL (model/ledger.pml includes it). */

#ifndef SECOND_RUN
#define SECOND_RUN 1
#endif
#ifndef BACKFILL
#define BACKFILL 1
#endif
#ifndef REPROCESS
#define REPROCESS 1
#endif
#ifndef OPERATOR
#define OPERATOR 1
#endif
#ifndef CRASHES
#define CRASHES 1
#endif
#ifndef DUPLICATES
#define DUPLICATES 1
#endif
#ifndef JOB_FAILURES
#define JOB_FAILURES 1
#endif
#ifndef REFUSALS
#define REFUSALS 1
#endif
#ifndef DB_ERRORS
#define DB_ERRORS 1
#endif
#ifndef EXPIRIES
#define EXPIRIES 1
#endif
#ifndef FINAL_ROUNDS
#define FINAL_ROUNDS 0   /* runs after every fault, to see that nothing was lost (each multiplies the states) */
#endif
#ifndef PRUNE
#define PRUNE 0          /* retention's steps (model/retention.pml), each folding one checkpoint at most */
#endif
#ifndef HORIZONS
#define HORIZONS 1       /* times the reprocess horizon passes what is committed by then */
#endif
#ifndef COMMITTED_BEFORE
#define COMMITTED_BEFORE 0   /* 1: offset 0 committed by an earlier run before the processes start */
#endif
#ifndef STALL_AFTER
#define STALL_AFTER 2
#endif

#define K 3            /* offsets 0..K-1: scheduled runs read [0, 1) and [2, 3), the backfill [1, 2) */
#define C 6            /* checkpoint rows */
#define A 4            /* attempts per checkpoint: 1..A-1 */
#define TRIES 2        /* an Airflow task's tries */
#define NOBODY 255
#define BASE_RUN 200   /* the retention base's dag_run_id, 'exactly_once:retention-base' */
#define BIT(o) (1 << (o))

#define SCHEDULED 0
#define BACKFILL_RUN 1
#define REPROCESSING 2
#define CLEARED 3      /* an operator's cleared tasks of a stalled checkpoint */

#define BEGIN 0
#define INCREMENT 1
#define COMMIT 2

/* What a job reports to its task (Job). */
#define STAGED 1       /* one copy of the range's rows */
#define FAILED 2
#define FAILED_FOR_GOOD 3
#define FENCED 4

mtype = { planned, running, stalled, precommitted, committed, aborted, none };

typedef Checkpoint {
    mtype state = none;
    byte attempt;          /* the current attempt: the fencing token */
    byte pre;              /* precommitted_attempt (0: none) */
    byte staged;           /* row copies the pre-commit counted */
    byte range;            /* its offsets, one bit each */
    bool released;         /* its ranges released by its abort ... */
    bool replanned;        /* ... and planned again by a later checkpoint */
    bool lease_expired;    /* aborted by a lease expiry (its reason says so) */
    byte replays;          /* a reprocessing: the checkpoint it replays, +1 */
    byte dag_run;          /* the DAG run that began it (dag_run_id) */
    bool lease_ok;         /* lease_until >= now */
    byte failures;         /* failed attempts of one cause in a row */
    bool permanent;        /* the newest failure said no retry can help */
    byte commit_failures;
    byte version;          /* configuration version its attempts run */
    byte stalled_at;       /* ghost: when it stalled (events) */
    bool beyond;           /* committed before now - reprocess_horizon */
    bool folded;           /* folded_at set: its contributions are the base's */
    byte locker = NOBODY;  /* FOR UPDATE */
    mtype att[A] = none;   /* each attempt's state (none: not started) */
    byte rows[A];          /* each attempt's committed staging rows, in copies of its range */
    byte reported[A];      /* what each attempt's job told its task */
}

Checkpoint cp[C];
byte checkpoints;          /* rows inserted */
byte frontier;             /* every offset below it is planned */
bool pipeline_locked;      /* lock_pipeline */
byte commits_shared;       /* lock_commits */
bool commits_alone;        /* lock_commits_alone */
byte events;               /* ghost clock of stalls and run starts */

/* The final tables and the committed ranges, per offset. */
byte committed_ranges[K];  /* committed ranges holding the offset */
byte counted[K];           /* copies of its record's rows in the final tables */
byte rows_version[K];      /* configuration version of the rows the sinks hold for it */
byte contribution[C];      /* row copies each checkpoint's slot holds in the final tables */
byte latest_version[C];    /* version of each slot's latest committed processing */
byte base = NOBODY;        /* the retention base checkpoint, once a fold created it */
byte base_rows[K];         /* row copies the base's contributions hold for each offset */

byte crashes = CRASHES;
byte duplicates = DUPLICATES;
byte job_failures = JOB_FAILURES;
byte refusals = REFUSALS;
byte db_errors = DB_ERRORS;
byte expiries = EXPIRIES;
bool final_runs;           /* the runs after every fault: none now, every lease ran out */

#define IN1(c, s1) (cp[c].state == s1)
#define IN2(c, s1, s2) (cp[c].state == s1 || cp[c].state == s2)
#define IN3(c, s1, s2, s3) (cp[c].state == s1 || cp[c].state == s2 || cp[c].state == s3)
#define TRANSITION(stmt, c, from, to) assert(from); cp[c].state = to
#define ATTEMPT_TRANSITION(stmt, c, a, from, to) assert(cp[c].att[a] == from); cp[c].att[a] = to

#define awaits_commit(c) (IN2(c, precommitted, stalled) && cp[c].pre != 0)
#define is_open(c) IN3(c, planned, running, stalled)
#define is_current(c, a) (cp[c].state == running && cp[c].attempt == a)
#define slot(c) (cp[c].replays == 0 -> c : cp[c].replays - 1)
#define faulty (!final_runs)

/* A crash here, or not, while the budget lasts. A fault is a choice (`true` is always one
   too), never an `else`, which spin takes only when nothing else can run. */
#define CRASH if :: crashes > 0 && faulty -> crashes--; goto crashed :: true -> skip fi

/* -- locks (a process's locks go with its transaction) ------------------------------------ */

inline lock_row(c) { atomic { cp[c].locker == NOBODY -> cp[c].locker = _pid; held_row = c } }
inline lock_pipeline() { atomic { !pipeline_locked -> pipeline_locked = true; held_pipeline = true } }
inline end_transaction() {
    if :: held_row != NOBODY -> cp[held_row].locker = NOBODY; held_row = NOBODY :: else -> skip fi;
    if :: held_pipeline -> pipeline_locked = false; held_pipeline = false :: else -> skip fi;
    if :: held_commits == 1 -> commits_shared-- :: held_commits == 2 -> commits_alone = false :: else -> skip fi;
    held_commits = 0
}
