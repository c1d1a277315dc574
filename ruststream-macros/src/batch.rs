//! `batch(max = 100, wait = "5ms")`: a handler that takes `Vec<T>`.

use darling::FromMeta;
use darling::ast::NestedMeta;
use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote};
use syn::spanned::Spanned;
use syn::{ReturnType, Type};

use crate::args::{Kind, check_keys, check_value};

const EXAMPLE: &str = "`batch(max = 100)` or `batch(max = 100, wait = \"5ms\")`";

/// The parsed `batch(..)`.
pub(crate) struct BatchArgs {
    /// Most records per batch: a literal or a constant.
    pub(crate) max: syn::Expr,
    /// How long to wait for more after the first, as a `Duration`
    /// expression (zero when not given).
    pub(crate) wait: TokenStream,
    /// Where `batch` is written (set by the caller, which has the path).
    pub(crate) span: Span,
}

impl FromMeta for BatchArgs {
    fn from_list(items: &[NestedMeta]) -> darling::Result<Self> {
        // Every mistake at once, not the first alone.
        let mut errors = darling::Error::accumulator();
        errors.handle(check_keys(items, &["max", "wait"], "`batch(..)`"));
        let mut max = None;
        let mut wait = None;
        for item in items {
            let NestedMeta::Meta(syn::Meta::NameValue(nv)) = item else {
                errors.push(darling::Error::custom(format!("write {EXAMPLE}")).with_span(item));
                continue;
            };
            let twice = |key: &str| {
                darling::Error::custom(format!("`{key}` is set twice")).with_span(&nv.path)
            };
            if nv.path.is_ident("max") {
                if max.is_some() {
                    errors.push(twice("max"));
                }
                errors.handle(check_value("max", Kind::Count, &nv.value, "100"));
                max = Some(nv.value.clone());
            } else if nv.path.is_ident("wait") {
                if wait.is_some() {
                    errors.push(twice("wait"));
                }
                wait = errors.handle(duration(&nv.value));
            }
        }
        if max.is_none() {
            errors.push(darling::Error::custom(format!(
                "give the most records per batch: {EXAMPLE}"
            )));
        }
        errors.finish()?;
        let (Some(max), wait) = (max, wait) else {
            unreachable!("a missing `max` is an error above");
        };
        let wait = wait.unwrap_or_else(|| quote!(::core::time::Duration::ZERO));
        Ok(BatchArgs {
            span: max.span(),
            max,
            wait,
        })
    }
}

/// `"5ms"`, `"250us"`, `"1s"`, `"100ns"` as a `Duration`, checked here; any
/// other expression is taken as a `Duration` the compiler checks.
fn duration(expr: &syn::Expr) -> darling::Result<TokenStream> {
    let syn::Expr::Lit(syn::ExprLit {
        lit: syn::Lit::Str(text),
        ..
    }) = expr
    else {
        return Ok(expr.to_token_stream());
    };
    let value = text.value();
    let split = value
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(value.len());
    let (number, unit) = value.split_at(split);
    let scale: u64 = match unit.trim() {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        _ => 0,
    };
    match number.parse::<u64>().ok().and_then(|n| n.checked_mul(scale)) {
        Some(nanos) if scale > 0 => Ok(quote!(::core::time::Duration::from_nanos(#nanos))),
        _ => Err(darling::Error::custom(
            "`wait` takes a whole number with a unit, e.g. `wait = \"5ms\"` (units: ns, us, ms, s), or a `Duration` constant",
        )
        .with_span(expr)),
    }
}

/// `T` of a body argument written `Vec<T>`.
pub(crate) fn element(ty: &Type) -> Option<&Type> {
    let Type::Path(path) = ty else { return None };
    let last = path.path.segments.last()?;
    if last.ident != "Vec" {
        return None;
    }
    let syn::PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    match args.args.first()? {
        syn::GenericArgument::Type(element) if args.args.len() == 1 => Some(element),
        _ => None,
    }
}

/// The error for a batch handler's signature: a body that is not a `Vec`,
/// or a reply (a batch replies to nothing).
pub(crate) fn check_signature(body: &Type, output: &ReturnType) -> Vec<syn::Error> {
    let mut errors = Vec::new();
    if element(body).is_none() {
        errors.push(syn::Error::new(
            body.span(),
            "a batch handler takes its records as a `Vec`, e.g. `orders: Vec<Order>`",
        ));
    }
    if let ReturnType::Type(_, ty) = output
        && !returns_nothing(ty)
    {
        errors.push(syn::Error::new(
            ty.span(),
            "a batch handler replies to nothing: return `()` or `Result<(), E>`",
        ));
    }
    errors
}

/// `()` or `Result<(), E>` (any path ending in `Result`).
fn returns_nothing(ty: &Type) -> bool {
    let unit = |ty: &Type| matches!(ty, Type::Tuple(t) if t.elems.is_empty());
    if unit(ty) {
        return true;
    }
    let Type::Path(path) = ty else { return false };
    let Some(last) = path.path.segments.last() else {
        return false;
    };
    let syn::PathArguments::AngleBracketed(args) = &last.arguments else {
        return false;
    };
    last.ident == "Result"
        && matches!(args.args.first(), Some(syn::GenericArgument::Type(ok)) if unit(ok))
}
