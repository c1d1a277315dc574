#[ruststream::app]
async fn main(settings: ruststream::settings::Settings, args: Vec<String>) {
    let _ = (settings, args);
}
