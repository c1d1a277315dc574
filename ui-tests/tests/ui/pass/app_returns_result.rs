//! `main` may return `ruststream::Result<()>` and use `?`.
use ruststream::prelude::*;

#[derive(Serialize, Deserialize)]
struct Greeting {
    name: String,
}

#[subscriber("greetings")]
async fn greet(greeting: Greeting) -> Greeting {
    Greeting {
        name: format!("hello, {}", greeting.name),
    }
}

#[ruststream::app]
async fn main() -> ruststream::Result<()> {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(greet)
        .start()
        .await?;
    let reply: Greeting = Publisher::new(broker)
        .request(
            "greetings",
            &Greeting { name: "ada".into() },
            std::time::Duration::from_secs(5),
        )
        .await?;
    assert_eq!(reply.name, "hello, ada");
    running.shutdown().await?;
    Ok(())
}
