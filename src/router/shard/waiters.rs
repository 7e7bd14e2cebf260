//! The requester's table of visits waiting for an owner's answer, with their deadlines.
//!
//! A waiting visit is one entry: whom to wake, when to give up, and the answer once it comes.
//! The answer stays in the entry until the visit takes it, so a wait dropped in the turn between
//! its answer arriving and its next poll (the client left, or the router's drain ended a hold)
//! hands the answer back ([`Waiters::abandon`]) and what the owner granted is given back: a slot,
//! a reservation, a quota charge. Before this table, the answer sat in a channel that was
//! dropped with the wait, and a grant in it was never released.
//!
//! Deadlines are not one timer per wait. A wait registers its deadline here, and one task per shard
//! ([`crate::router::shard::state::Shard::run_visit_deadlines`]) sleeps until the earliest
//! registered, expires every wait that is due, and sleeps until the earliest left, but at least
//! [`SWEEP_EVERY`] (so a wait may end up to that much after its deadline). A sweep looks at every
//! wait of the shard; the floor bounds that work when many long waits expire one after another (a
//! deep capacity queue timing out): at most 200 sweeps a second. A visit answered within
//! microseconds (nearly every one) costs a map insert and a remove; a timer of its own would cost
//! an allocation, a 640-byte copy and the runtime's wheel insert, poll and remove
//! (`perf/notes/2026-12-03-visits-without-a-timer-and-fat-lto.md`). The task wakes when the
//! earliest deadline it knew passes, even if that wait was answered long ago: at most once per
//! request timeout in steady traffic, where each new deadline is later than the one it sleeps
//! until.
//!
//! No I/O and no clock: the shard passes `now`, so the table is tested on its own.

use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::base::ids::IdMap;
use crate::base::latch::keep_waker;
use crate::router::shard::owner::Answer;

/// The least time between two sweeps of the deadline task.
pub const SWEEP_EVERY: Duration = Duration::from_millis(5);

/// The visits of one shard waiting for answers, by ticket sequence. Bound: one entry per visit
/// in progress, each taken out when its wait ends (answer taken, deadline, or drop), and a
/// request visits one owner at a time.
#[derive(Default)]
pub struct Waiters {
    entries: IdMap<u64, Entry>,
    /// When the deadline task wakes next; `None` while no wait has a deadline.
    next_deadline: Option<Instant>,
    /// The deadline task, woken when a wait registers a deadline earlier than `next_deadline`.
    sweeper: Option<Waker>,
}

enum Entry {
    Waiting {
        waker: Option<Waker>,
        /// `None` until the wait registers one ([`Waiters::set_deadline`]).
        deadline: Option<Instant>,
    },
    Answered(Answer),
    /// The deadline passed before an answer came.
    Expired,
}

/// Where an answer went.
#[derive(Debug)]
pub enum Delivered {
    /// Into its wait's entry; the waker, if the wait was polled already, is the caller's to wake.
    Kept(Option<Waker>),
    /// Nobody waits for it any more: the caller gives back what it granted
    /// ([`Answer::unwanted`]).
    Unwanted(Answer),
}

/// How a wait ended.
#[derive(Debug)]
pub enum Ended {
    Answered(Answer),
    Expired,
    /// The entry was not there (cannot happen while its visit waits).
    Missing,
}

impl Waiters {
    /// A visit about to be sent (or served inline without an answer yet) will wait for
    /// `sequence`'s answer.
    pub fn expect(&mut self, sequence: u64) {
        self.entries.insert(
            sequence,
            Entry::Waiting {
                waker: None,
                deadline: None,
            },
        );
    }

    /// The wait for `sequence` gives up at `deadline`. Returns the deadline task's waker when
    /// it must re-arm (this deadline is its earliest); the caller wakes it.
    #[must_use]
    pub fn set_deadline(&mut self, sequence: u64, deadline: Instant) -> Option<Waker> {
        let Some(Entry::Waiting { deadline: slot, .. }) = self.entries.get_mut(&sequence) else {
            return None;
        };
        *slot = Some(deadline);
        if self.next_deadline.is_some_and(|next| next <= deadline) {
            return None;
        }
        self.next_deadline = Some(deadline);
        self.sweeper.take()
    }

    /// `sequence`'s answer, kept for its wait, or handed back when nobody waits any more.
    pub fn answer(&mut self, sequence: u64, answer: Answer) -> Delivered {
        match self.entries.get_mut(&sequence) {
            Some(entry @ Entry::Waiting { .. }) => {
                let waker = match entry {
                    Entry::Waiting { waker, .. } => waker.take(),
                    _ => None,
                };
                *entry = Entry::Answered(answer);
                Delivered::Kept(waker)
            }
            // Expired, or answered twice (an owner answers a ticket once): nobody takes it.
            _ => Delivered::Unwanted(answer),
        }
    }

    /// Polls `sequence`'s wait: ends it (the entry goes) once answered or expired.
    pub fn poll_end(&mut self, sequence: u64, context: &Context<'_>) -> Poll<Ended> {
        match self.entries.get_mut(&sequence) {
            None => Poll::Ready(Ended::Missing),
            Some(Entry::Waiting { waker, .. }) => {
                keep_waker(waker, context.waker());
                Poll::Pending
            }
            Some(_) => match self.entries.remove(&sequence) {
                Some(Entry::Answered(answer)) => Poll::Ready(Ended::Answered(answer)),
                _ => Poll::Ready(Ended::Expired),
            },
        }
    }

    /// The wait for `sequence` is dropped before it ended: its entry goes, and an answer that
    /// came meanwhile is handed back for the caller to give back.
    pub fn abandon(&mut self, sequence: u64) -> Option<Answer> {
        match self.entries.remove(&sequence) {
            Some(Entry::Answered(answer)) => Some(answer),
            _ => None,
        }
    }

    /// When the deadline task should wake; `None`: when a wait registers a deadline, and
    /// `waker` is woken then.
    pub fn next_deadline(&mut self, waker: &Waker) -> Option<Instant> {
        if self.next_deadline.is_none() {
            keep_waker(&mut self.sweeper, waker);
        }
        self.next_deadline
    }

    /// Whether the deadline task, asleep until `until`, must re-arm for an earlier deadline;
    /// if not, `waker` is woken when it must.
    pub fn rearm(&mut self, until: Instant, waker: &Waker) -> bool {
        if self.next_deadline != Some(until) {
            return true;
        }
        keep_waker(&mut self.sweeper, waker);
        false
    }

    /// Expires every wait whose deadline is at or before `now` and appends its waker to
    /// `wake`; the next sweep is due at the earliest deadline left, and not before
    /// [`SWEEP_EVERY`] from `now`.
    pub fn expire(&mut self, now: Instant, wake: &mut Vec<Waker>) {
        let mut next: Option<Instant> = None;
        for entry in self.entries.values_mut() {
            let Entry::Waiting {
                deadline: Some(deadline),
                waker,
            } = entry
            else {
                continue;
            };
            if *deadline <= now {
                wake.extend(waker.take());
                *entry = Entry::Expired;
            } else if next.is_none_or(|next| *deadline < next) {
                next = Some(*deadline);
            }
        }
        self.next_deadline = next.map(|next| next.max(now + SWEEP_EVERY));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::ids::{ModelId, Ticket};
    use crate::router::shard::owner::{Decision, Notice};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;
    use std::time::Duration;

    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn waker() -> (Arc<Count>, Waker) {
        let count = Arc::new(Count::default());
        (count.clone(), Waker::from(count))
    }

    fn granted() -> Answer {
        Answer::decided(
            ModelId(3),
            Decision::Granted(crate::logic::routing::Grant {
                agent: crate::base::ids::AgentId(1),
                generation: crate::base::ids::Generation(1),
                step: 0,
            }),
        )
    }

    #[test]
    fn an_answer_wakes_its_wait_which_takes_it_and_leaves_nothing() {
        let mut waiters = Waiters::default();
        let (woken, waker) = waker();
        let context = Context::from_waker(&waker);
        waiters.expect(1);
        assert!(waiters.poll_end(1, &context).is_pending());
        let Delivered::Kept(Some(to_wake)) = waiters.answer(1, granted()) else {
            panic!("kept for the wait polled once");
        };
        to_wake.wake();
        assert_eq!(woken.0.load(Ordering::Relaxed), 1);
        assert!(matches!(
            waiters.poll_end(1, &context),
            Poll::Ready(Ended::Answered(Answer::Decided { .. }))
        ));
        assert_eq!(waiters.len(), 0);
    }

    #[test]
    fn a_wait_dropped_after_its_answer_came_hands_the_grant_back() {
        // The turn in which a grant arrives and the client leaves: the request's future is
        // dropped without being polled again. The grant must come back to be released.
        let mut waiters = Waiters::default();
        waiters.expect(7);
        assert!(matches!(
            waiters.answer(7, granted()),
            Delivered::Kept(None)
        ));
        let answer = waiters.abandon(7).expect("the grant is handed back");
        let ticket = Ticket {
            shard: 0,
            sequence: 7,
        };
        assert!(matches!(
            answer.unwanted(ticket),
            Some(Notice::Release { .. })
        ));
        assert_eq!(waiters.len(), 0);
        // An answer after the wait is gone is handed back at once.
        assert!(matches!(
            waiters.answer(7, granted()),
            Delivered::Unwanted(_)
        ));
    }

    #[test]
    fn deadlines_expire_the_due_waits_and_keep_the_earliest_left() {
        let mut waiters = Waiters::default();
        let (swept, sweeper) = waker();
        let (_, waker) = waker();
        let context = Context::from_waker(&waker);
        let start = Instant::now();
        assert_eq!(waiters.next_deadline(&sweeper), None);
        for sequence in 1..=3 {
            waiters.expect(sequence);
            assert!(waiters.poll_end(sequence, &context).is_pending());
        }
        // The first deadline wakes the sleeping task; a later one does not; an earlier one does.
        waiters
            .set_deadline(2, start + Duration::from_secs(2))
            .expect("the task sleeps without a deadline")
            .wake();
        assert_eq!(swept.0.load(Ordering::Relaxed), 1);
        assert!(
            waiters
                .set_deadline(3, start + Duration::from_secs(3))
                .is_none()
        );
        assert!(!waiters.rearm(start + Duration::from_secs(2), &sweeper));
        waiters
            .set_deadline(1, start + Duration::from_secs(1))
            .expect("an earlier deadline re-arms the task")
            .wake();
        assert!(waiters.rearm(start + Duration::from_secs(2), &sweeper));
        assert_eq!(
            waiters.next_deadline(&sweeper),
            Some(start + Duration::from_secs(1))
        );

        let mut wake = Vec::new();
        waiters.expire(start + Duration::from_secs(2), &mut wake);
        assert_eq!(wake.len(), 2, "the waits due at 1 s and 2 s");
        assert_eq!(
            waiters.next_deadline(&sweeper),
            Some(start + Duration::from_secs(3))
        );
        assert!(matches!(
            waiters.poll_end(1, &context),
            Poll::Ready(Ended::Expired)
        ));
        // An answer after the deadline finds nobody: it is given back.
        assert!(matches!(
            waiters.answer(2, granted()),
            Delivered::Unwanted(_)
        ));
        assert!(matches!(
            waiters.poll_end(2, &context),
            Poll::Ready(Ended::Expired)
        ));
        assert!(waiters.poll_end(3, &context).is_pending());

        wake.clear();
        waiters.expire(start + Duration::from_secs(3), &mut wake);
        assert_eq!(wake.len(), 1);
        assert_eq!(waiters.next_deadline(&sweeper), None);
    }

    #[test]
    fn waits_expiring_one_after_another_are_swept_at_most_every_few_milliseconds() {
        let mut waiters = Waiters::default();
        let (_, sweeper) = waker();
        let (_, waker) = waker();
        let context = Context::from_waker(&waker);
        let start = Instant::now();
        // A deep queue whose waits time out a tenth of a millisecond apart.
        for sequence in 0..100u64 {
            waiters.expect(sequence);
            assert!(waiters.poll_end(sequence, &context).is_pending());
            let _ = waiters.set_deadline(sequence, start + Duration::from_micros(100 * sequence));
        }
        let mut wake = Vec::new();
        let mut sweeps = 0;
        let mut now = start;
        while let Some(next) = waiters.next_deadline(&sweeper) {
            assert!(sweeps == 0 || next >= now + SWEEP_EVERY);
            now = next;
            waiters.expire(now, &mut wake);
            sweeps += 1;
        }
        assert_eq!(wake.len(), 100, "every wait expires");
        assert!(sweeps <= 3, "10 ms of deadlines took {sweeps} sweeps");
    }

    #[test]
    fn an_answered_wait_is_not_expired() {
        let mut waiters = Waiters::default();
        let start = Instant::now();
        waiters.expect(1);
        let _ = waiters.set_deadline(1, start);
        assert!(matches!(waiters.answer(1, granted()), Delivered::Kept(_)));
        let mut wake = Vec::new();
        waiters.expire(start + Duration::from_secs(1), &mut wake);
        assert!(wake.is_empty());
        assert!(waiters.abandon(1).is_some());
    }
}
