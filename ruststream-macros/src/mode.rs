//! The execution-mode arguments of `#[subscriber]`: `workers(n)`,
//! `workers(n, by_key)`, `workers(n, by_key = key_fn)`, and the same for
//! `threads(..)`.

use darling::FromMeta;
use darling::ast::NestedMeta;
use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::spanned::Spanned;

/// Where a by-key mode takes the key from.
pub(crate) enum KeyFrom {
    /// The delivery's own key.
    Delivery,
    /// A function of the decoded body (and optionally the envelope, for
    /// headers): `fn(&Body) -> impl Hash` or `fn(&Body, &Envelope) -> impl Hash`.
    Body(syn::Path),
}

/// `(n, by_key...)`.
pub(crate) struct Pool {
    /// The count: a literal, or a constant.
    pub(crate) n: syn::Expr,
    pub(crate) by_key: Option<KeyFrom>,
    pub(crate) span: Span,
}

impl FromMeta for Pool {
    /// Every mistake at once: the count and each argument after it.
    fn from_list(items: &[NestedMeta]) -> darling::Result<Self> {
        let Some((first, rest)) = items.split_first() else {
            return Err(darling::Error::custom(
                "give the number of workers or threads, e.g. `workers(4)`",
            ));
        };
        let mut errors = darling::Error::accumulator();
        let count = "the first argument is the count: a whole number of at least 1 or a constant, e.g. `workers(4)`";
        let n: Option<syn::Expr> = match first {
            NestedMeta::Lit(syn::Lit::Int(n)) => match n.base10_parse::<usize>() {
                Ok(0) => {
                    errors.push(darling::Error::custom(
                        "needs at least 1: `workers(0)` or `threads(0)` would never run the handler",
                    )
                    .with_span(n));
                    None
                }
                Ok(_) => Some(syn::parse_quote!(#n)),
                Err(_) => {
                    errors.push(darling::Error::custom(count).with_span(n));
                    None
                }
            },
            NestedMeta::Meta(syn::Meta::Path(path)) if !path.is_ident("by_key") => {
                Some(syn::parse_quote!(#path))
            }
            other => {
                errors.push(darling::Error::custom(count).with_span(other));
                None
            }
        };
        let span = first.span();
        let mut by_key = None;
        for item in rest {
            let key = match item {
                NestedMeta::Meta(syn::Meta::Path(p)) if p.is_ident("by_key") => KeyFrom::Delivery,
                NestedMeta::Meta(syn::Meta::NameValue(nv)) if nv.path.is_ident("by_key") => {
                    match &nv.value {
                        syn::Expr::Path(p) => KeyFrom::Body(p.path.clone()),
                        other => {
                            errors.push(darling::Error::custom(
                                "`by_key = ...` takes the name of a function `fn(&Body) -> impl Hash`",
                            )
                            .with_span(other));
                            continue;
                        }
                    }
                }
                other => {
                    errors.push(darling::Error::custom(
                        "expected `by_key` (the delivery's key) or `by_key = key_fn` (a function of the body)",
                    )
                    .with_span(other));
                    continue;
                }
            };
            if by_key.replace(key).is_some() {
                errors.push(darling::Error::custom("`by_key` is set twice").with_span(item));
            }
        }
        errors.finish()?;
        let n = n.expect("a count without errors");
        Ok(Pool { n, by_key, span })
    }
}

/// The `SubscriberConfig` builder calls for a mode.
pub(crate) fn config_calls(workers: Option<&Pool>, threads: Option<&Pool>) -> TokenStream {
    match (workers, threads) {
        (Some(p), _) => {
            let n = &p.n;
            if p.by_key.is_some() {
                quote!(.workers_by_key(#n))
            } else {
                quote!(.workers(#n))
            }
        }
        (None, Some(p)) => {
            let n = &p.n;
            if p.by_key.is_some() {
                quote!(.threads_by_key(#n))
            } else {
                quote!(.threads(#n))
            }
        }
        (None, None) => TokenStream::new(),
    }
}

/// The `Subscriber::key` override for `by_key = key_fn`.
pub(crate) fn key_fn(pool: Option<&Pool>, body_ty: &syn::Type) -> TokenStream {
    match pool.and_then(|p| p.by_key.as_ref()) {
        Some(KeyFrom::Body(path)) => {
            let span = path.span();
            quote::quote_spanned! {span=>
                fn key(&self, body: &#body_ty, envelope: &::ruststream::Envelope) -> u64 {
                    ::ruststream::__private::KeyFn::key_hash(&#path, body, envelope)
                }
            }
        }
        _ => TokenStream::new(),
    }
}
