//! Shared argument checks: unknown keys are reported with the list of valid
//! ones before darling parses the rest.

use darling::ast::NestedMeta;
use syn::spanned::Spanned;

/// Errors for every `key` not in `valid`, on the key's span.
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
            let list = valid
                .iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", ");
            errors.push(
                darling::Error::custom(format!(
                    "unknown {what} argument `{name}`; valid arguments are: {list}"
                ))
                .with_span(&path.span()),
            );
        }
    }
    errors.finish()
}
