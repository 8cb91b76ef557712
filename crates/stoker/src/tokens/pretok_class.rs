//! The character classes of the pre-tokenizer patterns ([`super::pretok`]) and of their
//! generated range tables ([`super::pretok_tables`]), apart from both so that neither imports
//! the other.

/// The four classes the pattern tells apart; they partition the Unicode scalar values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    /// `\p{L}`: general category L.
    Letter,
    /// `\p{N}`: general category N.
    Number,
    /// `\s`: Unicode White_Space.
    Space,
    /// Everything else: `[^\s\p{L}\p{N}]`.
    Other,
}

/// The classes o200k's pattern tells apart (Oniguruma's general categories); they partition the
/// Unicode scalar values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fine {
    /// `\p{Lu}` or `\p{Lt}`.
    Upper,
    /// `\p{Ll}`.
    Lower,
    /// `\p{Lm}` or `\p{Lo}`: in both of the pattern's letter sets.
    Caseless,
    /// `\p{M}`: not a letter, yet in both letter sets.
    Mark,
    /// `\p{N}`.
    Number,
    /// `\s`.
    Space,
    /// Everything else.
    Other,
}
