//! Checking an app without starting it (`check` on the command line).

use super::App;
use super::running::check_state;
use crate::Result;
use crate::binding::Broker;

impl<B: Broker> App<B> {
    /// Checks what [`start`](Self::start) would refuse — the builder's
    /// mistakes, settings that name nothing, the job queue's settings, each
    /// subscriber's configuration and the shared state its handler takes —
    /// without subscribing, then closes the brokers (in reverse order). The
    /// brokers were connected when they were made: an app whose `main`
    /// returned has reached every one of them.
    ///
    /// ```
    /// use ruststream::prelude::*;
    /// use ruststream::ingress::JobQueueSettings;
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// App::new().broker(MemoryBroker::new()).check().await?;
    /// let bad = App::new()
    ///     .broker(MemoryBroker::new())
    ///     .job_queue(JobQueueSettings::default().pause_resume(50, 70));
    /// assert!(bad.check().await.is_err());
    /// # Ok::<_, ruststream::Error>(()) }).unwrap();
    /// ```
    pub async fn check(mut self) -> Result<()> {
        let verdict = self.verdict();
        let mut closed = Ok(());
        for broker in self.brokers.iter().rev() {
            if let Err(err) = broker.close().await {
                closed = closed.and(Err(err));
            }
        }
        verdict.and(closed)
    }

    fn verdict(&mut self) -> Result<()> {
        if let Some(mistake) = std::mem::take(&mut self.mistakes).into_iter().next() {
            return Err(mistake);
        }
        self.jobs.validate()?;
        for unit in &self.units {
            unit.config().validate()?;
            unit.refusal()?;
            check_state(
                |id| self.state.contains_key(&id),
                unit.config(),
                unit.requires(),
            )?;
        }
        Ok(())
    }
}
