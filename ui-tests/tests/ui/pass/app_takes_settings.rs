use ruststream::settings::Settings;
use ruststream::{App, MemoryBroker};

/// `main` may take the settings the binary loaded (feature `config`):
/// here the code's broker URL stands, no settings name another.
#[ruststream::app]
async fn main(settings: Settings) -> ruststream::Result<()> {
    assert_eq!(settings.broker("memory").url_or("in-process"), "in-process");
    App::new().broker(MemoryBroker::new()).settings(&settings).check().await
}
