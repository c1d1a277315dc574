//! `#[subscriber(...)]`: keeps the function, adds a companion type of the same
//! name that implements `ruststream::subscriber::Subscriber` by delegating to
//! it.
//!
//! Every problem with the arguments or the signature is collected and
//! reported at once. The companion type is emitted even then (with a
//! configuration that never runs), so the only errors a user sees are the
//! ones on their code — never a cascade such as "`fn(..)` is not a
//! subscriber" under a function that is annotated.

use darling::FromMeta;
use darling::ast::NestedMeta;
use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, Pat, ReturnType, Type};

use crate::args::{Kind, check_value, unknown};
use crate::batch::{self, BatchArgs};
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
    "max_pending_bytes_per_key",
    "fail_fast",
    "receive_flow",
    "max_message_size",
    "batch",
    "crate",
];

/// Errors as they are found, reported together.
#[derive(Default)]
struct Errors(Vec<TokenStream>);

impl Errors {
    fn syn(&mut self, err: syn::Error) {
        self.0.push(err.to_compile_error());
    }

    fn darling(&mut self, err: darling::Error) {
        self.0.push(err.write_errors());
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl ToTokens for Errors {
    fn to_tokens(&self, tokens: &mut TokenStream) {
        tokens.extend(self.0.iter().cloned());
    }
}

/// The subject: a string literal (copied without a reference count) or a
/// constant.
enum Subject {
    Literal(syn::LitStr),
    Expr(syn::Expr),
}

#[derive(Default)]
struct Options {
    queue_group: Option<syn::Expr>,
    dead_letter: Option<syn::Expr>,
    max_attempts: Option<syn::Expr>,
    codec: Option<syn::Path>,
    workers: Option<Pool>,
    threads: Option<Pool>,
    max_pending: Option<syn::Expr>,
    max_pending_per_key: Option<syn::Expr>,
    max_pending_bytes_per_key: Option<syn::Expr>,
    fail_fast: bool,
    receive_flow: Option<syn::Expr>,
    max_message_size: Option<syn::Expr>,
    batch: Option<BatchArgs>,
    /// `crate = "path"`: where the runtime crate is, when renamed.
    krate: Option<syn::Path>,
}

struct Args {
    subject: Option<Subject>,
    options: Options,
}

const SUBJECT_FIRST: &str = "the first argument must be the subject: a string or a constant, e.g. `#[subscriber(\"orders.created\")]`";

fn parse_args(args: TokenStream, errors: &mut Errors) -> Args {
    let mut out = Args {
        subject: None,
        options: Options::default(),
    };
    let first = args.clone().into_iter().next();
    let metas = match NestedMeta::parse_meta_list(args) {
        Ok(metas) => metas,
        Err(err) => {
            // `#[subscriber(orders.created)]`: say what is wrong, not "expected `,`".
            match &first {
                Some(TokenTree::Ident(ident)) => {
                    errors.syn(syn::Error::new(ident.span(), SUBJECT_FIRST))
                }
                _ => errors.syn(err),
            }
            return out;
        }
    };
    let rest = match metas.split_first() {
        Some((NestedMeta::Lit(syn::Lit::Str(subject)), rest)) => {
            if subject.value().is_empty() {
                errors.syn(syn::Error::new_spanned(
                    subject,
                    "the subject must not be empty",
                ));
            }
            out.subject = Some(Subject::Literal(subject.clone()));
            rest
        }
        Some((NestedMeta::Meta(syn::Meta::Path(path)), rest)) if !is_option(path) => {
            out.subject = Some(Subject::Expr(syn::parse_quote!(#path)));
            rest
        }
        Some((first, rest)) => {
            errors.darling(darling::Error::custom(SUBJECT_FIRST).with_span(first));
            // An option written first is checked with the others; anything
            // else in the subject's place has had its error.
            let option = matches!(first, NestedMeta::Meta(meta) if is_option(meta.path()));
            if option { &metas[..] } else { rest }
        }
        None => {
            errors.syn(syn::Error::new(
                Span::call_site(),
                "missing subject: write `#[subscriber(\"orders.created\")]`",
            ));
            return out;
        }
    };
    parse_options(rest, &mut out.options, errors);
    if out.subject.is_none() && errors.is_empty() {
        errors.syn(syn::Error::new(Span::call_site(), SUBJECT_FIRST));
    }
    out
}

/// Whether `path` names one of `#[subscriber]`'s options rather than a
/// subject constant.
fn is_option(path: &syn::Path) -> bool {
    path.is_ident("fail_fast") || VALID.iter().any(|k| path.is_ident(k))
}

fn parse_options(metas: &[NestedMeta], options: &mut Options, errors: &mut Errors) {
    let mut seen: Vec<String> = Vec::new();
    for item in metas {
        let meta = match item {
            NestedMeta::Meta(meta) => meta,
            NestedMeta::Lit(lit) => {
                errors.syn(syn::Error::new_spanned(
                    lit,
                    "expected `name = value` or `name(..)`; only the first argument is the subject",
                ));
                continue;
            }
        };
        let path = meta.path();
        let key = path
            .get_ident()
            .map(ToString::to_string)
            .unwrap_or_else(|| quote!(#path).to_string());
        if !VALID.contains(&key.as_str()) {
            errors.syn(syn::Error::new_spanned(
                path,
                unknown(&key, VALID, "`#[subscriber]`"),
            ));
            continue;
        }
        if seen.contains(&key) {
            errors.syn(syn::Error::new_spanned(
                path,
                format!("`{key}` is set twice"),
            ));
            continue;
        }
        seen.push(key.clone());
        if let Err(err) = parse_option(&key, meta, options) {
            errors.darling(err);
        }
    }
    if let (Some(_), Some(threads)) = (&options.workers, &options.threads) {
        errors.darling(
            darling::Error::custom(
                "choose one execution mode: `workers(..)` or `threads(..)`, not both",
            )
            .with_span(&threads.span),
        );
    }
    if let Some(batch) = &options.batch
        && (options.workers.is_some() || options.threads.is_some())
    {
        errors.darling(
            darling::Error::custom(
                "`batch(..)` hands one batch at a time to the handler, in the subscriber's own loop: \
                 it does not combine with `workers(..)` or `threads(..)`",
            )
            .with_span(&batch.span),
        );
    }
    let by_key_workers = options.workers.as_ref().is_some_and(|w| w.by_key.is_some());
    for (name, limit) in [
        ("max_pending", &options.max_pending),
        ("max_pending_per_key", &options.max_pending_per_key),
        (
            "max_pending_bytes_per_key",
            &options.max_pending_bytes_per_key,
        ),
    ] {
        if let Some(n) = limit
            && !by_key_workers
        {
            errors.syn(syn::Error::new_spanned(
                n,
                format!(
                    "`{name}` bounds the owner FIFOs of `workers(n, by_key)`; it has no effect here"
                ),
            ));
        }
    }
}

/// One `key = value` or `key(..)`.
fn parse_option(key: &str, meta: &syn::Meta, options: &mut Options) -> darling::Result<()> {
    let value = |kind: Kind, example: &str| -> darling::Result<syn::Expr> {
        match meta {
            syn::Meta::NameValue(nv) => {
                check_value(key, kind, &nv.value, example)?;
                Ok(nv.value.clone())
            }
            other => Err(darling::Error::custom(format!(
                "`{key}` takes a value: `{key} = {example}`"
            ))
            .with_span(other)),
        }
    };
    match key {
        "queue_group" => options.queue_group = Some(value(Kind::Text, "\"workers\"")?),
        "dead_letter" => options.dead_letter = Some(value(Kind::Text, "\"orders.dead\"")?),
        "max_attempts" => options.max_attempts = Some(value(Kind::Count, "5")?),
        "max_pending" => options.max_pending = Some(value(Kind::Count, "64")?),
        "max_pending_per_key" => options.max_pending_per_key = Some(value(Kind::Count, "8")?),
        "max_pending_bytes_per_key" => {
            options.max_pending_bytes_per_key = Some(value(Kind::Count, "1048576")?)
        }
        "max_message_size" => options.max_message_size = Some(value(Kind::Count, "65536")?),
        "receive_flow" => options.receive_flow = Some(value(Kind::Bool, "false")?),
        "codec" => {
            options.codec = Some(match meta {
                syn::Meta::NameValue(syn::MetaNameValue {
                    value: syn::Expr::Path(p),
                    ..
                }) => p.path.clone(),
                other => {
                    return Err(darling::Error::custom(
                        "`codec` takes a codec type, e.g. `codec = ruststream::Json`",
                    )
                    .with_span(other));
                }
            });
        }
        "crate" => {
            let lit = match value(Kind::Text, "\"my_ruststream\"")? {
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }) => s,
                other => {
                    return Err(darling::Error::custom(
                        "`crate` takes the path of the ruststream crate as a string, e.g. `crate = \"my_ruststream\"`",
                    )
                    .with_span(&other));
                }
            };
            options.krate = Some(lit.parse()?);
        }
        "fail_fast" => match meta {
            syn::Meta::Path(_) => options.fail_fast = true,
            other => {
                return Err(
                    darling::Error::custom("`fail_fast` is a flag: write `fail_fast`")
                        .with_span(other),
                );
            }
        },
        "batch" => match meta {
            syn::Meta::List(list) => {
                let mut batch = BatchArgs::from_meta(meta)?;
                batch.span = list.path.span();
                options.batch = Some(batch);
            }
            other => {
                return Err(darling::Error::custom(
                    "give the batch size: `batch(max = 100)` or `batch(max = 100, wait = \"5ms\")`",
                )
                .with_span(other));
            }
        },
        "workers" | "threads" => {
            let pool = match meta {
                syn::Meta::List(_) => Pool::from_meta(meta)?,
                other => {
                    return Err(darling::Error::custom(format!(
                        "give the count: `{key}(4)` (or `{key}(4, by_key)`)"
                    ))
                    .with_span(other));
                }
            };
            if key == "workers" {
                options.workers = Some(pool);
            } else {
                options.threads = Some(pool);
            }
        }
        _ => unreachable!("checked against VALID"),
    }
    Ok(())
}

/// What the signature says: the body (the first argument), the extractors
/// (the others) and the return type.
struct Signature<'a> {
    body: Option<&'a syn::PatType>,
    extractors: Vec<&'a syn::PatType>,
    output: TokenStream,
    /// False when a wrapper with the same parameters would not compile
    /// (generics, `self`): the function is then left as it is.
    wrappable: bool,
}

fn analyze<'a>(function: &'a syn::ItemFn, errors: &mut Errors) -> Signature<'a> {
    let sig = &function.sig;
    let mut wrappable = true;
    if sig.asyncness.is_none() {
        errors.syn(syn::Error::new_spanned(
            sig.fn_token,
            "a subscriber must be an `async fn`",
        ));
    }
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        errors.syn(syn::Error::new_spanned(
            &sig.generics,
            "a subscriber cannot be generic",
        ));
        wrappable = false;
    }
    // `impl Trait` in an argument is a generic in disguise.
    for input in &sig.inputs {
        if let syn::FnArg::Typed(arg) = input
            && let syn::Type::ImplTrait(ty) = &*arg.ty
        {
            errors.syn(syn::Error::new_spanned(
                ty,
                "a subscriber cannot be generic: give this argument a concrete type",
            ));
            wrappable = false;
        }
    }
    // The first argument is the body; every other one is an extractor, which
    // the compiler checks by trait (`FromDelivery`), never by its name.
    let mut body: Option<&syn::PatType> = None;
    let mut extractors = Vec::new();
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(r) => {
                errors.syn(syn::Error::new_spanned(
                    r,
                    "a subscriber is a free function; it cannot take `self`",
                ));
                wrappable = false;
            }
            FnArg::Typed(arg) if body.is_none() => {
                if let Type::Reference(r) = &*arg.ty {
                    errors.syn(syn::Error::new_spanned(
                        r,
                        "a body is decoded into an owned value: take `String` instead of `&str`, \
                         or `Bytes`/`Vec<u8>` instead of `&[u8]`",
                    ));
                }
                body = Some(arg);
            }
            FnArg::Typed(arg) => {
                if let Type::Reference(r) = &*arg.ty {
                    errors.syn(syn::Error::new_spanned(
                        r,
                        "an extractor is an owned value: take `Headers`, `Subject`, `Ctx`, ... \
                         without `&`",
                    ));
                }
                extractors.push(arg);
            }
        }
    }
    if body.is_none() && wrappable {
        errors.syn(syn::Error::new_spanned(
            &sig.ident,
            "a subscriber needs one body argument, the decoded message (e.g. `order: Order`, or `payload: Bytes` for raw bytes)",
        ));
    }
    let output = match &sig.output {
        ReturnType::Default => quote!(()),
        ReturnType::Type(_, ty) => {
            if let Some(msg) = unsupported_return(ty) {
                errors.syn(syn::Error::new_spanned(ty, msg));
            }
            quote!(#ty)
        }
    };
    Signature {
        body,
        extractors,
        output,
        wrappable,
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
    let mut errors = Errors::default();
    let args = parse_args(args, &mut errors);
    let signature = analyze(&function, &mut errors);
    if args.options.batch.is_some()
        && let Some(body) = signature.body
    {
        for err in batch::check_signature(&body.ty, &function.sig.output) {
            errors.syn(err);
        }
    }
    let expanded = if !signature.wrappable {
        // Keep the function so the rest of the file still type-checks.
        function.to_token_stream()
    } else if errors.is_empty() {
        generate(&function, &args, &signature)
    } else {
        degraded(&function, &args, &signature)
    };
    let out = quote!(#expanded #errors);
    match &args.options.krate {
        Some(krate) => replace_crate(out, krate),
        None => out,
    }
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

/// The function, turned into one that returns its future tagged with the
/// companion type; its parameters keep their names where they are plain
/// identifiers, other patterns are bound inside the future, so every
/// argument moves into it as it would for an `async fn`. The body's
/// statements go into the future as they are (no block in a block, so a
/// one-line handler gets no `unused_braces` warning).
fn wrapper(function: &syn::ItemFn, output: &TokenStream, kind: &TokenStream) -> TokenStream {
    let syn::ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = function;
    let name = &sig.ident;
    let mut params = Vec::new();
    let mut rebinds = Vec::new();
    for (i, input) in sig.inputs.iter().enumerate() {
        let FnArg::Typed(arg) = input else { continue };
        let ty = &arg.ty;
        match &*arg.pat {
            Pat::Ident(p) if p.by_ref.is_none() && p.subpat.is_none() => {
                let ident = &p.ident;
                params.push(quote!(#ident: #ty));
                rebinds.push(quote!(let #p = #ident;));
            }
            pat => {
                let param = format_ident!("__arg{}", i);
                params.push(quote!(#param: #ty));
                rebinds.push(quote!(let #pat = #param;));
            }
        }
    }
    let stmts = &block.stmts;
    quote! {
        #(#attrs)*
        #vis fn #name(#(#params),*) -> ::ruststream::__private::Handler<
            #name,
            impl ::core::future::Future<Output = #output>,
            #kind,
        > {
            ::ruststream::__private::Handler::new(async move {
                #(#rebinds)*
                #(#stmts)*
            })
        }
    }
}

/// `Local` for `threads(n)` (the future may be `!Send`), `Pooled` otherwise.
fn kind(options: &Options) -> TokenStream {
    if options.threads.is_some() {
        quote!(::ruststream::__private::Local)
    } else {
        quote!(::ruststream::__private::Pooled)
    }
}

/// The companion type when the arguments or the signature had errors: the
/// same shape, so `.subscriber(f)` still type-checks, with methods that
/// never run (the crate does not compile).
fn degraded(function: &syn::ItemFn, args: &Args, signature: &Signature<'_>) -> TokenStream {
    let name = &function.sig.ident;
    let vis = &function.vis;
    let kind = kind(&args.options);
    let wrapped = wrapper(function, &signature.output, &kind);
    let body_ty = match signature.body {
        Some(arg) if !matches!(&*arg.ty, Type::Reference(_)) => arg.ty.to_token_stream(),
        _ => quote!(()),
    };
    let unreachable = quote!(::core::unreachable!(
        "`#[subscriber]` reported an error; this never runs"
    ));
    quote! {
        #wrapped

        #[allow(non_camel_case_types, dead_code)]
        #[doc(hidden)]
        #vis struct #name {}

        const _: () = {
            impl ::core::default::Default for #name {
                fn default() -> Self {
                    #name {}
                }
            }

            impl ::ruststream::subscriber::Subscriber for #name {
                type Body = #body_ty;
                type Codec = ::ruststream::Json;

                fn config(&self) -> ::ruststream::subscriber::SubscriberConfig {
                    #unreachable
                }

                fn decode(
                    &self,
                    _: &::ruststream::__private::Bytes,
                ) -> ::core::result::Result<#body_ty, ::ruststream::BoxError> {
                    #unreachable
                }

                #[allow(unreachable_code)]
                fn handle(
                    &self,
                    _: #body_ty,
                    _: &::ruststream::subscriber::Scope<'_>,
                ) -> impl ::core::future::Future<Output = ::ruststream::__private::Outcome> {
                    async { #unreachable }
                }
            }

            impl ::ruststream::subscriber::SendSubscriber for #name {
                #[allow(unreachable_code)]
                fn handle_send(
                    &self,
                    _: #body_ty,
                    _: &::ruststream::subscriber::Scope<'_>,
                ) -> impl ::core::future::Future<Output = ::ruststream::__private::Outcome>
                       + ::core::marker::Send {
                    async { #unreachable }
                }
            }
        };
    }
}

/// The `SubscriberConfig` the arguments describe.
fn config(args: &Args) -> TokenStream {
    let options = &args.options;
    let mut config = match &args.subject {
        // A literal: a static `Text`, so the subject every delivery carries
        // is copied without touching a reference count.
        Some(Subject::Literal(subject)) => quote!(::ruststream::subscriber::SubscriberConfig::new(
            ::ruststream::Text::from_static(#subject)
        )),
        Some(Subject::Expr(subject)) => {
            quote_spanned!(subject.span()=> ::ruststream::subscriber::SubscriberConfig::new(#subject))
        }
        None => unreachable!("a missing subject is an error"),
    };
    for (method, value) in [
        ("queue_group", &options.queue_group),
        ("dead_letter", &options.dead_letter),
        ("max_attempts", &options.max_attempts),
        ("max_pending", &options.max_pending),
        ("max_pending_per_key", &options.max_pending_per_key),
        (
            "max_pending_bytes_per_key",
            &options.max_pending_bytes_per_key,
        ),
        ("max_message_size", &options.max_message_size),
        ("receive_flow", &options.receive_flow),
    ] {
        if let Some(value) = value {
            let method = format_ident!("{}", method, span = value.span());
            config.extend(quote_spanned!(value.span()=> .#method(#value)));
        }
    }
    config.extend(mode::config_calls(
        options.workers.as_ref(),
        options.threads.as_ref(),
    ));
    if options.fail_fast {
        config.extend(quote!(.fail_fast(true)));
    }
    if let Some(BatchArgs { max, wait, .. }) = &options.batch {
        config.extend(quote_spanned!(max.span()=> .batch(#max, #wait)));
    }
    config
}

fn generate(function: &syn::ItemFn, args: &Args, signature: &Signature<'_>) -> TokenStream {
    let name = &function.sig.ident;
    let vis = &function.vis;
    let Some(body) = signature.body else {
        unreachable!("a missing body is an error")
    };
    let extractors = &signature.extractors;
    let options = &args.options;
    // A batch handler's `Vec<T>` is made of bodies of type `T`.
    let batched = options.batch.is_some();
    let body_ty = match options.batch {
        Some(_) => batch::element(&body.ty).expect("checked by `check_signature`"),
        None => &*body.ty,
    };
    let codec = match &options.codec {
        Some(path) => quote!(#path),
        None => quote!(::ruststream::Json),
    };
    let config = config(args);
    let kind = kind(options);
    let wrapped = wrapper(function, &signature.output, &kind);

    // Each extractor is taken before the handler starts; its error settles
    // the delivery instead. Spanned on the argument's type, so a type that is
    // not an extractor is reported there.
    let ext_vars: Vec<_> = (0..extractors.len())
        .map(|i| format_ident!("__extracted{}", i))
        .collect();
    // A batch handler's extractors read the app, not one delivery:
    // `FromBatch` says which can.
    let ext_calls: Vec<_> = extractors
        .iter()
        .map(|arg| {
            let ty = &arg.ty;
            if batched {
                quote_spanned! {ty.span()=>
                    <#ty as ::ruststream::extract::FromBatch>::from_batch(__scope)?
                }
            } else {
                quote_spanned! {ty.span()=>
                    <#ty as ::ruststream::extract::FromDelivery>::from_delivery(__scope)?
                }
            }
        })
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
    let key_fn = mode::key_fn(
        options.workers.as_ref().or(options.threads.as_ref()),
        body_ty,
    );
    // The codec spanned on the body too: a body the codec cannot decode is
    // reported on the body argument.
    let body_codec = respanned(codec.clone(), body_ty.span());
    let decode = quote_spanned! {body_ty.span()=>
        (&&::ruststream::__private::BodyKind::<#body_ty>::new())
            .decode_body::<#body_codec>(payload)
    };
    // A `Result` return goes through `HandlerResult`, whose message names
    // the fix when its error type is not a handler error.
    let returns_result = matches!(&function.sig.output,
        ReturnType::Type(_, ty) if matches!(&**ty, Type::Path(p) if p.path.segments.last().is_some_and(|s| s.ident == "Result")));
    let reply_ty = if batched {
        quote!(())
    } else {
        reply_type(&function.sig.output, returns_result)
    };
    let content_types = quote_spanned! {body_ty.span()=>
        #[inline]
        fn content_type(&self) -> ::core::option::Option<&'static str> {
            #[allow(unused_imports)]
            use ::ruststream::__private::{CodecBody as _, RawBody as _};
            (&&::ruststream::__private::BodyKind::<#body_ty>::new()).content_type::<#codec>()
        }

        #[inline]
        fn reply_content_type(&self) -> ::core::option::Option<&'static str> {
            #[allow(unused_imports)]
            use ::ruststream::__private::{CodecReply as _, RawReply as _};
            (&&::ruststream::__private::ReplyKind::<#reply_ty>::new()).content_type::<#codec>()
        }
    };
    // Names the body and reply types; with ruststream's `asyncapi`
    // feature, their schemas too (the runtime's macro decides).
    let message_types = quote! {
        fn message_types(&self) -> ::ruststream::subscriber::MessageTypes {
            ::ruststream::__private::message_types!(#body_ty, #reply_ty)
        }
    };
    let out_span = match &function.sig.output {
        ReturnType::Default => Span::call_site(),
        ReturnType::Type(_, ty) => ty.span(),
    };
    let outcome = if returns_result {
        quote_spanned! {out_span=>
            ::ruststream::__private::outcome!(result #codec, __future.await)
        }
    } else {
        quote_spanned! {out_span=>
            ::ruststream::__private::outcome!(#codec, __future.await)
        }
    };
    // The call with `body` as the first argument. Without extractors the
    // handler's future is made at once, as a plain call would: nothing is
    // taken, nothing can fail before it.
    let invoke = |body: TokenStream| {
        let call_args = std::iter::once(body).chain(ext_vars.iter().map(|v| quote!(#v)));
        if extractors.is_empty() {
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
        }
    };

    let handle_invoke = if batched {
        invoke(quote!(::std::vec![__body]))
    } else {
        invoke(quote!(__body))
    };
    // `threads(n)` handlers may be `!Send`: no `SendSubscriber` impl for
    // them; every other mode requires a `Send` future.
    let send_impl = if options.threads.is_some() {
        TokenStream::new()
    } else {
        // A batch handler is called with the whole batch; `handle` (one
        // body) hands it a batch of one.
        let handle_batch = batched.then(|| {
            let invoke = invoke(quote!(__bodies));
            quote! {
                #[allow(unused_variables)]
                fn handle_batch(
                    &self,
                    __bodies: ::std::vec::Vec<#body_ty>,
                    __scope: &::ruststream::subscriber::Scope<'_>,
                ) -> impl ::core::future::Future<Output = ::ruststream::__private::Outcome>
                       + ::core::marker::Send {
                    ::ruststream::__private::requires_send_handler_or_threads_n({ #invoke })
                }
            }
        });
        quote_spanned! {function.sig.ident.span()=>
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

                #handle_batch
            }
        }
    };

    quote! {
        #wrapped

        #[allow(non_camel_case_types, dead_code)]
        #[doc(hidden)]
        #vis struct #name {}

        const _: () = {
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

                #content_types

                #message_types

                #[allow(unused_variables)]
                fn handle(
                    &self,
                    __body: #body_ty,
                    __scope: &::ruststream::subscriber::Scope<'_>,
                ) -> impl ::core::future::Future<Output = ::ruststream::__private::Outcome> {
                    #handle_invoke
                }
            }

            #send_impl
        };
    }
}

/// The type a handler replies with: its return type, or the success type
/// of a `Result` return.
fn reply_type(output: &ReturnType, returns_result: bool) -> TokenStream {
    let ReturnType::Type(_, ty) = output else {
        return quote!(());
    };
    if returns_result
        && let Type::Path(path) = &**ty
        && let Some(last) = path.path.segments.last()
        && let syn::PathArguments::AngleBracketed(args) = &last.arguments
        && let Some(syn::GenericArgument::Type(ok)) = args.args.first()
    {
        return quote!(#ok);
    }
    quote!(#ty)
}

/// `tokens` with every span set to `span`.
fn respanned(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut tree| {
            if let TokenTree::Group(group) = &tree {
                let mut inner =
                    proc_macro2::Group::new(group.delimiter(), respanned(group.stream(), span));
                inner.set_span(span);
                tree = TokenTree::Group(inner);
            }
            tree.set_span(span);
            tree
        })
        .collect()
}

/// Replaces every `::ruststream` path prefix with `krate` (for
/// `crate = "..."`).
pub(crate) fn replace_crate(tokens: TokenStream, krate: &syn::Path) -> TokenStream {
    // A crate name is absolute (`::name`); `crate::..`, `self::..` and
    // `super::..` paths are used as they are.
    let relative = krate
        .segments
        .first()
        .is_some_and(|s| s.ident == "crate" || s.ident == "self" || s.ident == "super");
    let replacement = if krate.leading_colon.is_some() || relative {
        krate.to_token_stream()
    } else {
        quote!(::#krate)
    };
    let tokens: Vec<TokenTree> = tokens.into_iter().collect();
    let mut out = TokenStream::new();
    let mut i = 0;
    while i < tokens.len() {
        if let (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)), Some(TokenTree::Ident(id))) =
            (tokens.get(i), tokens.get(i + 1), tokens.get(i + 2))
            && a.as_char() == ':'
            && b.as_char() == ':'
            && id == "ruststream"
        {
            out.extend(replacement.clone());
            i += 3;
            continue;
        }
        match &tokens[i] {
            TokenTree::Group(group) => {
                let mut inner = proc_macro2::Group::new(
                    group.delimiter(),
                    replace_crate(group.stream(), krate),
                );
                inner.set_span(group.span());
                out.extend(std::iter::once(TokenTree::Group(inner)));
            }
            other => out.extend(std::iter::once(other.clone())),
        }
        i += 1;
    }
    out
}
