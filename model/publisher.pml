/* The publisher of one kafka sink (exactly_once.publishing.publisher, progress, plugins/exactly_once/sql/outbox.sql),
   modelled for spin: two publishers of the sink (a run's publish and the `publish` command,
   or a zombie and its successor) interleaving in every order, beside the commits that add
   outbox rows in any order.

   The outbox: S slots in frontier order (rank, checkpoint, position; outbox.sql's ranks),
   one output row each. A slot is pending (its checkpoint open, or its range released and not
   planned again) until a commit adds its row; publishing waits behind the first pending slot
   (held_behind), so a row committed out of order waits for those ranked before it. Kafka: the
   sink's topic, its progress topic (the last row a committed transaction holds), and the
   transactional id's epoch (init_transactions bumps it; a transaction of an older epoch does
   not commit: fenced). The database: outbox_published and the rows pruned (a prefix).

   One publish_sink: init_transactions; read Kafka's progress; reconcile (under the sink's
   lock: the database's progress, the outbox row at Kafka's progress, held_behind), the
   verdict, the progress recorded and the outbox pruned up to it; held_behind and next_rows
   (one snapshot); batches of B rows, each a Kafka transaction carrying its progress,
   recorded after its commit; at the end, recorded and pruned.

   Properties: every committed outbox row reaches the topic exactly once, in frontier order
   (each commit of a transaction continues the topic where its progress stands); a row is
   pruned only once published; no OutboxMismatch (nothing here restores a database or deletes
   a topic, so none is warranted); and after a last publisher with no fault, every row is
   published, recorded and pruned.

   Bounds: SINK_LOCK (0: the reads of the reconcile and the record and prune of another
   publisher interleave, as before issue 60), RUNS (publish_sink calls per publisher),
   CRASHES (a publisher dies), ABORTS (the broker aborts a transaction past its timeout). */

#ifndef SINK_LOCK
#define SINK_LOCK 1
#endif
#ifndef PROGRESS_UNDER_LOCK
#define PROGRESS_UNDER_LOCK 0
#endif
#ifndef RUNS
#define RUNS 1
#endif
#ifndef CRASHES
#define CRASHES 0
#endif
#ifndef ABORTS
#define ABORTS 0
#endif
#ifndef S
#define S 3            /* output rows, one per slot of the frontier order: 1..S */
#endif
#ifndef B
#define B 2            /* batch_rows */
#endif

bool committed[S + 1];  /* the slot's row is in the outbox (a commit added it) */
byte pruned;            /* rows 1..pruned deleted from the outbox */
byte db_published;      /* exactly_once.outbox_published: the row (0: none) */
bool sink_locked;       /* lock_sink */
byte epoch;             /* the transactional id's producer epoch */
byte kafka_progress;    /* the progress topic's last committed record (0: none) */
byte in_topic[S + 1];   /* committed copies of each row in the sink's topic */
byte crashes = CRASHES;
byte aborts = ABORTS;
bool final_run;         /* the last publisher: no fault */

#define faulty (!final_run)
#define CRASH if :: crashes > 0 && faulty -> crashes--; goto crashed :: true -> skip fi
#define in_outbox(r) (r > pruned && committed[r])

inline first_pending() {   /* held_behind: S + 1 when nothing holds publishing */
    hold = 1;
    do
    :: hold <= S && committed[hold] -> hold++
    :: else -> break
    od
}

inline lock_sink() {
#if SINK_LOCK
    atomic { !sink_locked -> sink_locked = true; held_lock = true }
#else
    skip
#endif
}

inline unlock_sink() {
    if :: held_lock -> sink_locked = false; held_lock = false :: else -> skip fi
}

/* _record: a transaction under the sink's lock (its writes commit together). */
inline record(r, prune) {
    atomic {
#if SINK_LOCK
        !sink_locked ->
#endif
        if   /* record_published: the row must be in the outbox; never backwards */
        :: in_outbox(r) && r > db_published -> db_published = r
        :: else -> skip
        fi;
        if   /* prune: the rows up to it (none if it is pruned already) */
        :: prune && in_outbox(r) ->
           assert(r <= kafka_progress);   /* what is pruned was published */
           pruned = r
        :: else -> skip
        fi
    }
}

/* progress.verdict: where publishing goes on, or OutboxMismatch. */
inline verdict() {
    if
    :: in_kafka == 0 ->
       assert(known == 0);   /* OutboxMismatch: Kafka holds no progress, the database recorded some */
       at = 0
    :: else ->
       assert(hold > in_kafka);   /* OutboxMismatch: Kafka's progress past an open checkpoint */
       assert(known <= in_kafka);   /* OutboxMismatch: Kafka behind the database */
       if
       :: known == in_kafka -> skip
       :: else -> assert(present)   /* OutboxMismatch: the outbox holds no row at Kafka's progress */
       fi;
       at = in_kafka
    fi
}

proctype Publisher() {
    byte runs = RUNS, mine, in_kafka, known, hold, at, first, last, r;
    bool present, held_lock, done_any;
    do
    :: runs > 0 ->
       runs--; done_any = false;
       atomic { epoch++; mine = epoch }   /* init_transactions: every earlier producer fenced */
       CRASH;   /* fault: publish.after_init */
#if PROGRESS_UNDER_LOCK
       lock_sink();   /* _reconcile's transaction, its lock taken before Kafka's progress is read */
       in_kafka = kafka_progress;   /* progress.read (read_committed) */
#else
       in_kafka = kafka_progress;   /* progress.read (read_committed) */
       lock_sink();   /* _reconcile: one transaction */
#endif
       known = db_published;   /* published */
       present = in_kafka > 0 && in_outbox(in_kafka);   /* epoch_at */
       atomic { first_pending() }   /* held_behind */
       atomic { unlock_sink() }
       verdict();
       if :: at > 0 -> record(at, true) :: else -> skip fi;
       /* _batches: held_behind, then next_rows from one snapshot (the outbox, pruned up to at) */
       atomic { first_pending() }
       atomic { first = pruned + 1; last = hold - 1 }
       do
       :: first <= last ->
          r = (first + B - 1 <= last -> first + B - 1 : last);
          /* begin_transaction; the rows first..r and the progress r produced */
          CRASH;   /* fault: publish.before_commit */
          atomic {   /* commit_transaction */
              if
              :: mine != epoch -> goto ended   /* fenced */
              :: mine == epoch && aborts > 0 && faulty -> aborts--; goto ended   /* aborted past its timeout */
              :: mine == epoch ->
                 assert(first == kafka_progress + 1);   /* in order: no row skipped, none twice */
                 do
                 :: first <= r -> assert(committed[first] && in_topic[first] == 0); in_topic[first]++; first++
                 :: else -> break
                 od;
                 kafka_progress = r
              fi
          }
          CRASH;   /* fault: publish.after_commit */
          record(r, false);
          at = r; done_any = true
       :: else -> break
       od;
       if :: done_any -> record(at, true) :: else -> skip fi;
       goto ended;
crashed:
ended:
       atomic { unlock_sink() }
    :: else -> break
    od
}

/* Commits of the pipeline: each adds its slot's row to the outbox, in any order. A row
   committed behind what Kafka's progress says was published would be skipped. */
proctype Commits() {
    byte s, n;
    do
    :: n < S ->
       select (s : 1 .. S);
       atomic { if :: !committed[s] -> assert(s > kafka_progress); committed[s] = true; n++ :: else -> skip fi }
    :: else -> break
    od
}

init {
    byte s;
    atomic {
        run Commits();
        run Publisher();
        run Publisher()
    }
    _nr_pr == 1;
    /* every row committed; a last publisher with no fault publishes the rest */
    atomic { s = 1; do :: s <= S -> committed[s] = true; s++ :: else -> break od; final_run = true }
    run Publisher();
    _nr_pr == 1;
    s = 1;
    do
    :: s <= S -> assert(in_topic[s] == 1); s++   /* every row once */
    :: else -> break
    od;
    assert(kafka_progress == S && db_published == S && pruned == S)
}
