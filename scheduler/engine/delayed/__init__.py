"""Delayed delivery in the leader: the life of a delayed task, top-down: accept, claim, publish,
book.

Each step is a method of the class that owns the state it works on, and calls the ports
(`TaskRepository`, `Broker`) and the term's `Horizon` (`horizon`: the heap, its lock and its
wake-up, one object every part shares). The detail is left to the helpers it names: fair firing
and its throttles (`fairness`), the bounded armed set (`armed`), quotas (`quota`), the budget of
stored refusals (`dead_budget`), dead-letter copies (`dead_letters`), the reschedule notice
(`rescheduled`).

1. **Accept** a batch from the lane (`intake.Intake`, whose `run` is the lane loop):
   `Intake.gather` takes it (longer while every task in it is due far ahead),
   `Intake.validate_all` validates each message alone, then `Intake.accept` stores the good ones
   in one `TaskRepository.insert_batch` (under the horizon's lock, those within the loaded
   horizon go onto the heap: `Horizon.arm`), rejects the bad ones to the dead letters, then acks.
2. **Claim** what falls due (`claims.Claimer`): `Claimer.claim_due` takes from the horizon
   (`Horizon.take_due`) what falls due within the lookahead and claims it with
   `TaskRepository.claim_within` (fenced by the epoch); `Claimer.arm_or_park` hands the claimed
   tasks to the armed set in firing order, and parks those beyond its byte room (fetched again
   in order by `Claimer.refill`, which also takes over an earlier leader's orphans).
3. **Publish** at the due millisecond (`dispatch.Dispatcher`): `Dispatcher.publish_due` hands
   every due task to `Broker.publish_tasks` at once (the broker builds every byte of the
   message); each acknowledgement (or failure) becomes an outcome.
4. **Book** the outcomes (`books.Books`): `Books.book` records a flush of them in one go
   (`mark_fired`, the expired, then the failed: `retry_later` with a backoff, back onto the
   horizon, or `kill` and a dead-letter copy).

*When* each step runs is the business of the loops: `Intake.run` (the lane) and
`Dispatcher.run` (the claim loop, plus the dispatch and bookkeeping loops it starts);
`engine.leader_loop.LeaderEngine` builds the horizon and these parts for each term of office and
runs them, with the loader that fills the horizon. Every part reports what happens through
`events.DelayedEvents` (`scheduler.metrics.Metrics` listens), once per batch on the hot path.
"""
