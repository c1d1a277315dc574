//! Shared argument checks: unknown keys with a "did you mean" suggestion,
//! and literals of the wrong kind named with what is expected.

use darling::ast::NestedMeta;
use syn::spanned::Spanned;

/// Errors for every `key` not in `valid`, on the key's span, with the
/// closest valid key when one is close.
pub(crate) fn check_keys(metas: &[NestedMeta], valid: &[&str], what: &str) -> darling::Result<()> {
    let mut errors = darling::Error::accumulator();
    for meta in metas {
        let NestedMeta::Meta(meta) = meta else {
            continue;
        };
        let path = meta.path();
        let name = path
            .get_ident()
            .map(ToString::to_string)
            .unwrap_or_else(|| quote::quote!(#path).to_string());
        if !valid.contains(&name.as_str()) {
            errors
                .push(darling::Error::custom(unknown(&name, valid, what)).with_span(&path.span()));
        }
    }
    errors.finish()
}

/// "unknown argument `x`; did you mean `y`?" or the list of valid ones.
pub(crate) fn unknown(name: &str, valid: &[&str], what: &str) -> String {
    match closest(name, valid) {
        Some(near) => format!("unknown {what} argument `{name}`; did you mean `{near}`?"),
        None => {
            let list = valid
                .iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", ");
            format!("unknown {what} argument `{name}`; valid arguments are: {list}")
        }
    }
}

/// The valid key `name` most likely means: the same letters without the
/// underscores, one extending the other, or at most two edits away.
fn closest<'a>(name: &str, valid: &[&'a str]) -> Option<&'a str> {
    let bare = |s: &str| s.replace('_', "").to_lowercase();
    let name_bare = bare(name);
    valid
        .iter()
        .map(|&k| {
            let k_bare = bare(k);
            let score = if k_bare == name_bare {
                0
            } else if k_bare.starts_with(&name_bare) || name_bare.starts_with(&k_bare) {
                1
            } else {
                edits(&name_bare, &k_bare)
            };
            (score, k)
        })
        .filter(|&(score, _)| score <= 2)
        .min_by_key(|&(score, _)| score)
        .map(|(_, k)| k)
}

/// Levenshtein distance.
fn edits(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// What kind of value an argument takes, for literals of the wrong kind.
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    /// A string: a literal, or a `const` / expression of type `&str` or `String`.
    Text,
    /// A whole number, at least 1.
    Count,
    /// `true` or `false`.
    Bool,
}

/// Checks `expr` for `key`: a literal must be of the right kind (and a
/// count at least 1, a string not empty); any other expression — a
/// constant, a call — is left to the compiler.
pub(crate) fn check_value(
    key: &str,
    kind: Kind,
    expr: &syn::Expr,
    example: &str,
) -> darling::Result<()> {
    let not_a_count = || {
        Err(darling::Error::custom(format!(
            "`{key}` takes a whole number of at least 1, e.g. `{key} = {example}`"
        ))
        .with_span(expr))
    };
    if let (
        Kind::Count,
        syn::Expr::Unary(syn::ExprUnary {
            op: syn::UnOp::Neg(_),
            ..
        }),
    ) = (kind, expr)
    {
        return not_a_count();
    }
    let syn::Expr::Lit(lit) = expr else {
        return Ok(());
    };
    let wrong = |example: &str| {
        Err(darling::Error::custom(format!(
            "`{key}` takes {example}, or a constant of that type"
        ))
        .with_span(expr))
    };
    match (kind, &lit.lit) {
        (Kind::Text, syn::Lit::Str(s)) if s.value().is_empty() => {
            Err(darling::Error::custom(format!("`{key}` must not be empty")).with_span(expr))
        }
        (Kind::Text, syn::Lit::Str(_)) => Ok(()),
        (Kind::Text, _) => wrong(&format!("a string, e.g. `{key} = {example}`")),
        (Kind::Count, syn::Lit::Int(n)) => match n.base10_parse::<u64>() {
            Ok(0) => {
                Err(darling::Error::custom(format!("`{key}` must be at least 1")).with_span(expr))
            }
            Ok(_) => Ok(()),
            // A negative number, or one past `u64`.
            Err(_) => not_a_count(),
        },
        (Kind::Count, _) => wrong(&format!("a whole number, e.g. `{key} = {example}`")),
        (Kind::Bool, syn::Lit::Bool(_)) => Ok(()),
        (Kind::Bool, _) => wrong("`true` or `false`"),
    }
}
