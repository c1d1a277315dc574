//! `#[subscriber(...)]`: keeps the function, adds a companion type of the same
//! name that implements `ruststream::Subscriber` by delegating to it.

use darling::FromMeta;
use darling::ast::NestedMeta;
use darling::util::SpannedValue;
use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, Pat, ReturnType, Type};

use crate::mode::{self, Pool};

const VALID: &[&str] = &[
    "queue_group",
    "dead_letter",
    "max_attempts",
    "codec",
    "workers",
    "threads",
    "max_pending",
    "max_pending_per_key",
    "fail_fast",
    "receive_flow",
    "max_message_size",
];

#[derive(Default, FromMeta)]
struct SubscriberArgs {
    queue_group: Option<String>,
    dead_letter: Option<String>,
    max_attempts: Option<SpannedValue<u32>>,
    codec: Option<syn::Path>,
    workers: Option<Pool>,
    threads: Option<Pool>,
    max_pending: Option<SpannedValue<usize>>,
    max_pending_per_key: Option<SpannedValue<usize>>,
    fail_fast: darling::util::Flag,
    receive_flow: Option<syn::Lit>,
    max_message_size: Option<SpannedValue<usize>>,
}

struct Args {
    subject: syn::LitStr,
    options: SubscriberArgs,
}

const SUBJECT_LITERAL: &str =
    "the subject must be a string literal, e.g. `#[subscriber(\"orders.created\")]`";

fn parse_args(args: TokenStream) -> darling::Result<Args> {
    let first = args.clone().into_iter().next();
    let metas = NestedMeta::parse_meta_list(args).map_err(|err| match &first {
        // `#[subscriber(orders.created)]`: say what is wrong, not "expected `,`".
        Some(proc_macro2::TokenTree::Ident(_)) => darling::Error::custom(SUBJECT_LITERAL)
            .with_span(&first.as_ref().map_or(err.span(), |t| t.span())),
        _ => darling::Error::from(err),
    })?;
    let (subject, rest) = match metas.split_first() {
        Some((NestedMeta::Lit(syn::Lit::Str(subject)), rest)) => (subject.clone(), rest),
        Some((NestedMeta::Meta(syn::Meta::Path(path)), _)) => {
            return Err(darling::Error::custom(format!(
                "{SUBJECT_LITERAL}; constants are not supported"
            ))
            .with_span(path));
        }
        Some((first, _)) => {
            return Err(darling::Error::custom(
                "the first argument must be the subject, e.g. `#[subscriber(\"orders.created\")]`",
            )
            .with_span(first));
        }
        None => {
            return Err(darling::Error::custom(
                "missing subject: write `#[subscriber(\"orders.created\")]`",
            ));
        }
    };
    if subject.value().is_empty() {
        return Err(darling::Error::custom("the subject must not be empty").with_span(&subject));
    }
    crate::args::check_keys(rest, VALID, "`#[subscriber]`")?;
    let options = SubscriberArgs::from_list(rest)?;
    if let Some(n) = options.max_attempts.as_ref().filter(|n| ***n == 0) {
        return Err(
            darling::Error::custom("`max_attempts` must be at least 1").with_span(&n.span())
        );
    }
    if let (Some(_), Some(threads)) = (&options.workers, &options.threads) {
        return Err(darling::Error::custom(
            "choose one execution mode: `workers(..)` or `threads(..)`, not both",
        )
        .with_span(&threads.span));
    }
    if let Some(lit) = &options.receive_flow
        && !matches!(lit, syn::Lit::Bool(_))
    {
        return Err(
            darling::Error::custom("`receive_flow` takes `true` or `false`").with_span(lit),
        );
    }
    if let Some(n) = &options.max_message_size
        && **n == 0
    {
        return Err(
            darling::Error::custom("`max_message_size` must be at least 1").with_span(&n.span()),
        );
    }
    let by_key_workers = options.workers.as_ref().is_some_and(|w| w.by_key.is_some());
    for (name, limit) in [
        ("max_pending", &options.max_pending),
        ("max_pending_per_key", &options.max_pending_per_key),
    ] {
        let Some(n) = limit else { continue };
        if !by_key_workers {
            return Err(darling::Error::custom(format!(
                "`{name}` bounds the owner FIFOs of `workers(n, by_key)`; it has no effect here"
            ))
            .with_span(&n.span()));
        }
        if **n == 0 {
            return Err(
                darling::Error::custom(format!("`{name}` must be at least 1")).with_span(&n.span()),
            );
        }
    }
    Ok(Args { subject, options })
}

pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let function: syn::ItemFn = match syn::parse2(item.clone()) {
        Ok(f) => f,
        Err(err) => {
            let err = err.to_compile_error();
            return quote!(#err #item);
        }
    };
    match expand_fn(args, &function) {
        Ok(tokens) => tokens,
        // Keep the function so the rest of the file still type-checks.
        Err(err) => quote!(#function #err),
    }
}

fn expand_fn(args: TokenStream, function: &syn::ItemFn) -> Result<TokenStream, TokenStream> {
    let mut errors = darling::Error::accumulator();
    let mut ranged: Option<syn::Error> = None;
    let mut push_ranged = |e: syn::Error| match &mut ranged {
        Some(all) => all.combine(e),
        None => ranged = Some(e),
    };
    let args = errors.handle(parse_args(args));
    let sig = &function.sig;
    if sig.asyncness.is_none() {
        errors.push(
            darling::Error::custom("a subscriber must be an `async fn`").with_span(&sig.fn_token),
        );
    }
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        push_ranged(syn::Error::new_spanned(
            &sig.generics,
            "a subscriber cannot be generic",
        ));
    }
    // The first argument is the body; every other one is an extractor, which
    // the compiler checks by trait (`FromDelivery`), never by its name.
    let mut body: Option<&syn::PatType> = None;
    let mut extractors: Vec<&syn::PatType> = Vec::new();
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(r) => push_ranged(syn::Error::new_spanned(
                r,
                "a subscriber is a free function; it cannot take `self`",
            )),
            FnArg::Typed(arg) if body.is_none() => {
                if let Type::Reference(r) = &*arg.ty {
                    push_ranged(syn::Error::new_spanned(
                        r,
                        "a body is decoded into an owned value: take `String` instead of `&str`, \
                         or `Bytes`/`Vec<u8>` instead of `&[u8]`",
                    ));
                }
                body = Some(arg);
            }
            FnArg::Typed(arg) => {
                if let Type::Reference(r) = &*arg.ty {
                    push_ranged(syn::Error::new_spanned(
                        r,
                        "an extractor is an owned value: take `Headers`, `Subject`, `Ctx`, ... \
                         without `&`",
                    ));
                }
                extractors.push(arg);
            }
        }
    }
    if body.is_none() && sig.inputs.iter().all(|i| matches!(i, FnArg::Typed(_))) {
        errors.push(
            darling::Error::custom(
                "a subscriber needs one body argument, the decoded message (e.g. `order: Order`, or `payload: Bytes` for raw bytes)",
            )
            .with_span(&sig.ident),
        );
    }
    let output = match &sig.output {
        ReturnType::Default => quote!(()),
        ReturnType::Type(_, ty) => {
            if let Some(msg) = unsupported_return(ty) {
                push_ranged(syn::Error::new_spanned(ty, msg));
            }
            quote!(#ty)
        }
    };
    let darling_errors = errors.finish().err().map(darling::Error::write_errors);
    if darling_errors.is_some() || ranged.is_some() {
        let mut out = darling_errors.unwrap_or_default();
        if let Some(e) = ranged {
            out.extend(e.to_compile_error());
        }
        return Err(out);
    }
    let (Some(args), Some(body)) = (args, body) else {
        unreachable!("errors were reported above")
    };
    Ok(generate(function, &args, body, &extractors, output))
}

fn unsupported_return(ty: &Type) -> Option<&'static str> {
    match ty {
        Type::ImplTrait(_) => Some(
            "unsupported return type: a subscriber returns `()`, a `Serialize` value or `Result<_, E>`, not `impl Trait`",
        ),
        Type::Reference(_) => Some(
            "unsupported return type: a reply must be owned; return `String` or a `Serialize` value instead of a reference",
        ),
        Type::BareFn(_) | Type::TraitObject(_) | Type::Never(_) => Some(
            "unsupported return type: a subscriber returns `()`, a `Serialize` value or `Result<_, E>`",
        ),
        _ => None,
    }
}

fn generate(
    function: &syn::ItemFn,
    args: &Args,
    body: &syn::PatType,
    extractors: &[&syn::PatType],
    output: TokenStream,
) -> TokenStream {
    let syn::ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = function;
    let name = &sig.ident;

    // Parameters keep their names where they are plain identifiers; other
    // patterns are bound inside the future, so every argument moves into it
    // as it would for an `async fn`.
    let mut params = Vec::new();
    let mut rebinds = Vec::new();
    for (i, input) in sig.inputs.iter().enumerate() {
        let FnArg::Typed(arg) = input else { continue };
        let ty = &arg.ty;
        let (param, pat) = match &*arg.pat {
            Pat::Ident(p) if p.by_ref.is_none() && p.subpat.is_none() => {
                (p.ident.clone(), quote!(#p))
            }
            pat => (format_ident!("__arg{}", i), quote!(#pat)),
        };
        params.push(quote!(#param: #ty));
        rebinds.push(quote!(let #pat = #param;));
    }

    let body_ty = &body.ty;
    let codec = match &args.options.codec {
        Some(path) => quote!(#path),
        None => quote!(::ruststream::Json),
    };
    let subject = &args.subject;
    // A literal: a static `Text`, so the subject every delivery carries is
    // copied without touching a reference count.
    let mut config = quote!(::ruststream::subscriber::SubscriberConfig::new(
        ::ruststream::Text::from_static(#subject)
    ));
    if let Some(group) = &args.options.queue_group {
        config.extend(quote!(.queue_group(#group)));
    }
    if let Some(dlq) = &args.options.dead_letter {
        config.extend(quote!(.dead_letter(#dlq)));
    }
    if let Some(n) = &args.options.max_attempts {
        let n = **n;
        config.extend(quote!(.max_attempts(#n)));
    }
    // Each extractor is taken before the handler starts; its error settles
    // the delivery instead. Spanned on the argument's type, so a type that is
    // not an extractor is reported there.
    let ext_vars: Vec<_> = (0..extractors.len())
        .map(|i| format_ident!("__extracted{}", i))
        .collect();
    let ext_calls = extractors.iter().map(|arg| {
        let ty = &arg.ty;
        quote_spanned! {ty.span()=>
            <#ty as ::ruststream::extract::FromDelivery>::from_delivery(__scope)?
        }
    });
    let call_args: Vec<_> = std::iter::once(quote!(__body))
        .chain(ext_vars.iter().map(|v| quote!(#v)))
        .collect();
    // Checked at `App::start`: state an extractor needs must be registered.
    let n_extractors = extractors.len();
    let ext_requirements = extractors.iter().map(|arg| {
        let ty = &arg.ty;
        quote_spanned! {ty.span()=>
            <#ty as ::ruststream::extract::FromDelivery>::required_state()
        }
    });
    let required_state = quote! {
        fn required_state(&self) -> ::std::vec::Vec<::ruststream::subscriber::StateKey> {
            let __each: [::core::option::Option<::ruststream::subscriber::StateKey>; #n_extractors] =
                [#(#ext_requirements),*];
            __each.into_iter().flatten().collect()
        }
    };
    let options = &args.options;
    config.extend(mode::config_calls(
        options.workers.as_ref(),
        options.threads.as_ref(),
    ));
    if let Some(n) = &options.max_pending {
        let n = **n;
        config.extend(quote!(.max_pending(#n)));
    }
    if let Some(n) = &options.max_pending_per_key {
        let n = **n;
        config.extend(quote!(.max_pending_per_key(#n)));
    }
    if options.fail_fast.is_present() {
        config.extend(quote!(.fail_fast(true)));
    }
    if let Some(n) = &options.max_message_size {
        let n = **n;
        config.extend(quote!(.max_message_size(#n)));
    }
    if let Some(on) = &options.receive_flow {
        config.extend(quote!(.receive_flow(#on)));
    }
    let key_fn = mode::key_fn(
        options.workers.as_ref().or(options.threads.as_ref()),
        body_ty,
    );
    // `threads(n)` handlers may be `!Send`: they get the `Local` marker and no
    // `SendSubscriber` impl; every other mode requires a `Send` future.
    let local = options.threads.is_some();
    let kind = if local {
        quote!(::ruststream::__private::Local)
    } else {
        quote!(::ruststream::__private::Pooled)
    };
    let send_impl = if local {
        TokenStream::new()
    } else {
        quote_spanned! {sig.ident.span()=>
            impl ::ruststream::subscriber::SendSubscriber for #name {
                fn handle_send(
                    &self,
                    __body: #body_ty,
                    __scope: &::ruststream::subscriber::Scope<'_>,
                ) -> impl ::core::future::Future<Output = ::ruststream::__private::Outcome>
                       + ::core::marker::Send {
                    ::ruststream::__private::requires_send_handler_or_threads_n(
                        <Self as ::ruststream::subscriber::Subscriber>::handle(self, __body, __scope),
                    )
                }
            }
        }
    };
    let decode = quote_spanned! {body_ty.span()=>
        (&&::ruststream::__private::BodyKind::<#body_ty>::new())
            .decode_body::<#codec>(payload)
    };
    let result_check = match &sig.output {
        ReturnType::Type(_, ty) if matches!(&**ty, Type::Path(p) if p.path.segments.last().is_some_and(|s| s.ident == "Result")) =>
        {
            quote_spanned! {ty.span()=>
                const _: () = ::ruststream::__private::assert_result::<#ty>();
            }
        }
        _ => TokenStream::new(),
    };
    let out_span = match &sig.output {
        ReturnType::Default => Span::call_site(),
        ReturnType::Type(_, ty) => ty.span(),
    };
    let outcome = quote_spanned! {out_span=>
        ::ruststream::__private::outcome!(#codec, __future.await)
    };
    let asyncness = quote!(async move);
    // Without extractors the handler's future is made at once, as a plain
    // call would: nothing is taken, nothing can fail before it.
    let invoke = if extractors.is_empty() {
        quote! {
            let __future = ::core::future::IntoFuture::into_future(#name(#(#call_args),*));
            async move { #outcome }
        }
    } else {
        quote! {
            let __extracted = (|| {
                ::core::result::Result::<_, ::ruststream::HandlerError>::Ok((#(#ext_calls,)*))
            })();
            async move {
                let (#(#ext_vars,)*) = match __extracted {
                    ::core::result::Result::Ok(__values) => __values,
                    ::core::result::Result::Err(__err) => {
                        return ::ruststream::__private::extractor_failed(__err);
                    }
                };
                let __future = ::core::future::IntoFuture::into_future(#name(#(#call_args),*));
                #outcome
            }
        }
    };

    quote! {
        #(#attrs)*
        #vis fn #name(#(#params),*) -> ::ruststream::__private::Handler<
            #name,
            impl ::core::future::Future<Output = #output>,
            #kind,
        > {
            ::ruststream::__private::Handler::new(#asyncness {
                #(#rebinds)*
                #block
            })
        }

        #[allow(non_camel_case_types, dead_code)]
        #[doc(hidden)]
        #vis struct #name {}

        const _: () = {
            #result_check

            impl ::core::default::Default for #name {
                fn default() -> Self {
                    #name {}
                }
            }

            impl ::ruststream::subscriber::Subscriber for #name {
                type Body = #body_ty;
                type Codec = #codec;

                fn config(&self) -> ::ruststream::subscriber::SubscriberConfig {
                    #config
                }

                #[inline]
                fn decode(
                    &self,
                    payload: &::ruststream::__private::Bytes,
                ) -> ::core::result::Result<#body_ty, ::ruststream::BoxError> {
                    #[allow(unused_imports)]
                    use ::ruststream::__private::{CodecBody as _, RawBody as _};
                    #decode
                }

                #key_fn

                #required_state

                #[allow(unused_variables)]
                fn handle(
                    &self,
                    __body: #body_ty,
                    __scope: &::ruststream::subscriber::Scope<'_>,
                ) -> impl ::core::future::Future<Output = ::ruststream::__private::Outcome> {
                    #invoke
                }
            }

            #send_impl
        };
    }
}
