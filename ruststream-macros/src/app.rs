//! `#[ruststream::app]`: `async fn main` on a Tokio runtime.

use darling::ast::NestedMeta;
use darling::util::SpannedValue;
use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;

const VALID: &[&str] = &["flavor", "worker_threads", "shutdown_timeout"];

#[derive(Default)]
struct AppArgs {
    flavor: Option<SpannedValue<String>>,
    worker_threads: Option<SpannedValue<usize>>,
    shutdown_timeout: Option<SpannedValue<String>>,
}

struct Config {
    current_thread: bool,
    worker_threads: Option<usize>,
    shutdown_timeout_ms: Option<u64>,
}

/// `"500ms"`, `"30s"`, `"2m"`, `"1h"` in milliseconds.
fn parse_duration_ms(text: &str) -> Option<u64> {
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().ok()?;
    let factor = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return None,
    };
    number.checked_mul(factor)
}

impl AppArgs {
    /// Validates combinations (collect first, check in one place).
    fn build(self) -> darling::Result<Config> {
        let mut errors = darling::Error::accumulator();
        let current_thread = match self.flavor.as_ref().map(|f| (f.as_str(), f.span())) {
            None | Some(("multi_thread", _)) => false,
            Some(("current_thread", _)) => true,
            Some((other, span)) => {
                errors.push(
                    darling::Error::custom(format!(
                        "unknown flavor `{other}`; expected \"multi_thread\" or \"current_thread\""
                    ))
                    .with_span(&span),
                );
                false
            }
        };
        if let Some(n) = &self.worker_threads {
            if current_thread {
                errors.push(
                    darling::Error::custom(
                        "`worker_threads` requires the \"multi_thread\" flavor; remove it or drop `flavor = \"current_thread\"`",
                    )
                    .with_span(&n.span()),
                );
            } else if **n == 0 {
                errors.push(
                    darling::Error::custom("`worker_threads` must be at least 1")
                        .with_span(&n.span()),
                );
            }
        }
        let shutdown_timeout_ms = self.shutdown_timeout.as_ref().and_then(|t| {
            let ms = parse_duration_ms(t.as_str());
            if ms.is_none() {
                errors.push(
                    darling::Error::custom(format!(
                        "invalid duration `{}`; write e.g. \"500ms\", \"30s\", \"2m\" or \"1h\"",
                        t.as_str()
                    ))
                    .with_span(&t.span()),
                );
            }
            ms
        });
        errors.finish_with(Config {
            current_thread,
            worker_threads: self.worker_threads.map(|n| *n),
            shutdown_timeout_ms,
        })
    }
}

pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let function: syn::ItemFn = match syn::parse2(item.clone()) {
        Ok(f) => f,
        Err(err) => {
            let err = err.to_compile_error();
            return quote!(#err #item);
        }
    };
    let config = parse(args);
    let mut errors = TokenStream::new();
    let config = match config {
        Ok(config) => config,
        Err(err) => {
            errors.extend(err.write_errors());
            // Still expand with defaults so the rest of the file type-checks.
            Config {
                current_thread: false,
                worker_threads: None,
                shutdown_timeout_ms: None,
            }
        }
    };
    if function.sig.asyncness.is_none() {
        let err = syn::Error::new_spanned(
            function.sig.fn_token,
            "`#[ruststream::app]` needs an `async fn`",
        );
        errors.extend(err.to_compile_error());
    }
    if function.sig.inputs.len() > 1 {
        let err = syn::Error::new_spanned(
            &function.sig.inputs,
            "`#[ruststream::app]` functions take no arguments, or one: `settings: ruststream::settings::Settings` (feature `config`)",
        );
        errors.extend(err.to_compile_error());
    }
    let syn::ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = function;
    let name = &sig.ident;
    let inputs = &sig.inputs;
    let takes_settings = sig.inputs.len() == 1;
    let output = match &sig.output {
        syn::ReturnType::Default => quote!(()),
        syn::ReturnType::Type(_, ty) => quote!(#ty),
    };
    let current_thread = config.current_thread;
    let shutdown_timeout = match config.shutdown_timeout_ms {
        Some(ms) => quote!(::core::option::Option::Some(::core::time::Duration::from_millis(#ms))),
        None => quote!(::core::option::Option::None),
    };
    let worker_threads = match config.worker_threads {
        Some(n) => quote!(::core::option::Option::Some(#n)),
        None => quote!(::core::option::Option::None),
    };
    // Type errors about what `main` returns point at its return type.
    let body_span = match &sig.output {
        syn::ReturnType::Type(_, ty) => ty.span(),
        syn::ReturnType::Default => block.span(),
    };
    // A `main(settings: Settings)` gets the loaded settings.
    let run = if takes_settings {
        quote_spanned!(body_span=> ::ruststream::__private::run_main_with_settings)
    } else {
        quote_spanned!(body_span=> ::ruststream::__private::run_main)
    };
    let call = quote_spanned! {body_span=>
        #run(
            ::ruststream::__private::RuntimeConfig {
                current_thread: #current_thread,
                worker_threads: #worker_threads,
                shutdown_timeout: #shutdown_timeout,
                binary: ::core::option_env!("CARGO_BIN_NAME"),
                version: ::core::option_env!("CARGO_PKG_VERSION"),
            },
            __ruststream_body,
        )
    };
    let inputs = if takes_settings {
        quote!(#inputs)
    } else {
        quote!()
    };
    quote! {
        #(#attrs)*
        #vis fn #name() -> ::std::process::ExitCode {
            async fn __ruststream_body(#inputs) -> #output #block
            #call
        }
        #errors
    }
}

/// Every mistake at once, each saying what its argument takes.
fn parse(args: TokenStream) -> darling::Result<Config> {
    let metas = NestedMeta::parse_meta_list(args)?;
    let mut errors = darling::Error::accumulator();
    errors.handle(args_check(&metas));
    let mut parsed = AppArgs::default();
    let mut seen: Vec<String> = Vec::new();
    for item in &metas {
        let NestedMeta::Meta(meta) = item else {
            errors.push(
                darling::Error::custom(
                    "expected `name = value`, e.g. `flavor = \"current_thread\"`",
                )
                .with_span(item),
            );
            continue;
        };
        let Some(key) = meta.path().get_ident().map(ToString::to_string) else {
            continue;
        };
        let Some(takes) = takes(&key) else {
            continue; // unknown: reported by `args_check`
        };
        if seen.contains(&key) {
            errors.push(darling::Error::custom(format!("`{key}` is set twice")).with_span(meta));
            continue;
        }
        seen.push(key.clone());
        let wrong = || darling::Error::custom(format!("`{key}` takes {takes}")).with_span(meta);
        let syn::Meta::NameValue(syn::MetaNameValue {
            value: syn::Expr::Lit(syn::ExprLit { lit, .. }),
            ..
        }) = meta
        else {
            errors.push(wrong());
            continue;
        };
        let span = lit.span();
        match (key.as_str(), lit) {
            ("flavor", syn::Lit::Str(s)) => {
                parsed.flavor = Some(SpannedValue::new(s.value(), span))
            }
            ("shutdown_timeout", syn::Lit::Str(s)) => {
                parsed.shutdown_timeout = Some(SpannedValue::new(s.value(), span));
            }
            ("worker_threads", syn::Lit::Int(n)) => match n.base10_parse::<usize>() {
                Ok(n) => parsed.worker_threads = Some(SpannedValue::new(n, span)),
                Err(_) => errors.push(wrong()),
            },
            ("worker_threads", syn::Lit::Str(s)) => match s.value().parse::<usize>() {
                Ok(n) => parsed.worker_threads = Some(SpannedValue::new(n, span)),
                Err(_) => errors.push(wrong()),
            },
            _ => errors.push(wrong()),
        }
    }
    let config = errors.handle(parsed.build());
    errors.finish()?;
    Ok(config.expect("built without errors"))
}

/// What argument `key` takes, for its error; `None` for an unknown key.
fn takes(key: &str) -> Option<&'static str> {
    Some(match key {
        "flavor" => "\"multi_thread\" or \"current_thread\", e.g. `flavor = \"current_thread\"`",
        "worker_threads" => "a whole number of at least 1, e.g. `worker_threads = 4`",
        "shutdown_timeout" => "a duration as a string, e.g. `shutdown_timeout = \"30s\"`",
        _ => return None,
    })
}

fn args_check(metas: &[NestedMeta]) -> darling::Result<()> {
    crate::args::check_keys(metas, VALID, "`#[ruststream::app]`")
}
