//! `Result<(), E>` with any `E: Display` — here a `String`.
#[ruststream::app]
async fn main() -> Result<(), String> {
    Ok(())
}
