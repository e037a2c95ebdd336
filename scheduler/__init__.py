"""The scheduler: what waits enters the workers' queues only when its pipeline has room.

`mmq scheduler` (started by `mmq up`) runs `Scheduler.step` every
`batches.release_interval_s`. Each step reads every pipeline's slots (`slots`: what its
live workers run at once, less running jobs and the messages waiting in its queue), then:

- **fair share** (`fair_share`): with `fairness.enabled`, a submit that found no room was
  held; each pipeline's free slots go to its held jobs, highest priority first, and within
  a priority by turns between keys (stride scheduling, weighted). A newcomer's submit (its
  key has nothing at the workers, and its turn is the next) is not held: it releases its
  job itself, to the front of the queue, without waiting for a step;
- **preemption** (`preemption`): with `batches.preempt`, interactive work that waits for a
  slot held by a batch line stops the line that started last;
- **batch feeding** (`batch_feed`): each active batch's ended lines are collected into its
  output or error file, its waiting lines become jobs of priority `batch` while their
  pipeline has room nothing interactive wants, and a batch with nothing left ends;
- **on-demand turns** (`turns`): an on-demand pipeline in the way of a model waiting for
  its device's room is fed nothing new, so that it drains, unloads and makes room;
- **room** (`rooms`): what a submit may push at once, per pipeline and priority, and
  whether it takes newcomers (live workers, not draining), kept a few steps (with no
  scheduler running, submits push at once).

The scheduler decides; `jobstore.scheduling` and `jobstore.batch_store` read and write
Redis for it. The atomic halves live beside the keys: the submit's hold and its release
of a newcomer's job (`jobstore.lua` `SUBMIT`), the release of held jobs (`RELEASE_HELD`)
and an on-demand worker's claim of its device's room (`jobstore.device_room`).
"""
