//! The text of a JSON Lines record in one pass, into a buffer the caller reuses: the token
//! loader's hot path (issue 49). [`super::docs::json_text`] (serde_json) stays the reference:
//! a line this reader does not take, malformed or in a form it leaves alone (a lone surrogate,
//! nesting deeper than serde_json's limit), is read again by it, so the text and every error
//! message are serde_json's. This reader only ever accepts a line serde_json accepts, and then
//! gives the same text; it is at most as lenient: object keys at the top level are valid UTF-8
//! with valid escapes, other strings have valid escapes (`\u` with four hex digits) and no
//! control characters, numbers and literals follow JSON's grammar, nothing follows the object
//! but whitespace.

use super::docs::json_text;

/// Nesting this reader follows below the top-level object; deeper is left to serde_json.
const MAX_DEPTH: usize = 128;

/// Writes the string under `key` of the JSON object `line` into `out` (replacing what it
/// held), exactly as [`json_text`] reads it; a line that is not a JSON object with a string
/// `key` is an error saying why (serde_json's words).
pub fn json_text_into(line: &[u8], key: &str, out: &mut String) -> std::result::Result<(), String> {
    let mut bytes = std::mem::take(out).into_bytes();
    bytes.clear();
    let mut key_buf = Vec::new();
    let taken = Reader { b: line, i: 0 }.object(key.as_bytes(), &mut bytes, &mut key_buf) == Some(true);
    let mut bytes = match String::from_utf8(bytes) {
        Ok(s) if taken => {
            *out = s;
            return Ok(());
        }
        Ok(s) => s.into_bytes(),
        Err(e) => e.into_bytes(),
    };
    bytes.clear();
    *out = String::from_utf8(bytes).unwrap_or_default(); // empty: always UTF-8
    out.push_str(&json_text(line, key)?);
    Ok(())
}

/// A position in one line.
struct Reader<'a> {
    b: &'a [u8],
    i: usize,
}

impl Reader<'_> {
    /// Skips JSON whitespace.
    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.b.get(self.i) {
            self.i += 1;
        }
    }

    /// Takes byte `c` if it is next.
    fn eat(&mut self, c: u8) -> Option<()> {
        (self.b.get(self.i) == Some(&c)).then(|| self.i += 1)
    }

    /// The whole line as an object; the string under `key` (the first such member) is
    /// unescaped onto `out`. `Some(true)`: taken and found; `Some(false)`: no such key;
    /// `None`: left to serde_json.
    fn object(&mut self, key: &[u8], out: &mut Vec<u8>, key_buf: &mut Vec<u8>) -> Option<bool> {
        self.ws();
        self.eat(b'{')?;
        self.ws();
        let mut found = false;
        if self.eat(b'}').is_none() {
            loop {
                self.ws();
                self.eat(b'"')?;
                key_buf.clear();
                self.string(key_buf)?;
                std::str::from_utf8(key_buf).ok()?;
                self.ws();
                self.eat(b':')?;
                self.ws();
                if !found && key_buf.as_slice() == key {
                    self.eat(b'"')?; // not a string: serde_json says so
                    self.string(out)?;
                    found = true;
                } else {
                    self.skip_value(0)?;
                }
                self.ws();
                if self.eat(b',').is_some() {
                    continue;
                }
                self.eat(b'}')?;
                break;
            }
        }
        self.ws();
        (self.i == self.b.len()).then_some(found)
    }

    /// The rest of a string after its opening quote, unescaped onto `out` (raw bytes copied
    /// as they are: the caller checks UTF-8). A lone surrogate is left to serde_json.
    fn string(&mut self, out: &mut Vec<u8>) -> Option<()> {
        loop {
            let rest = &self.b[self.i..];
            let k = memchr::memchr2(b'"', b'\\', rest)?;
            let run = &rest[..k];
            if run.iter().fold(false, |bad, &c| bad | (c < 0x20)) {
                return None; // a control character
            }
            out.extend_from_slice(run);
            self.i += k + 1;
            if rest[k] == b'"' {
                return Some(());
            }
            let e = *self.b.get(self.i)?;
            self.i += 1;
            let simple = match e {
                b'"' => b'"',
                b'\\' => b'\\',
                b'/' => b'/',
                b'b' => 0x08,
                b'f' => 0x0c,
                b'n' => b'\n',
                b'r' => b'\r',
                b't' => b'\t',
                b'u' => {
                    let c = match self.hex4()? {
                        hi @ 0xD800..=0xDBFF => {
                            if self.b.get(self.i..self.i + 2)? != b"\\u" {
                                return None;
                            }
                            self.i += 2;
                            let lo = self.hex4()?;
                            if !(0xDC00..=0xDFFF).contains(&lo) {
                                return None;
                            }
                            char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))?
                        }
                        c => char::from_u32(c)?, // a lone trailing surrogate is None
                    };
                    out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
                    continue;
                }
                _ => return None,
            };
            out.push(simple);
        }
    }

    /// Four hex digits of a `\u` escape.
    fn hex4(&mut self) -> Option<u32> {
        let d = self.b.get(self.i..self.i + 4)?;
        let mut v = 0u32;
        for &c in d {
            v = v * 16 + (c as char).to_digit(16)?;
        }
        self.i += 4;
        Some(v)
    }

    /// The rest of a string that is not kept: escapes checked as serde_json checks an ignored
    /// string's (a `\u` needs four hex digits), control characters refused.
    fn skip_string(&mut self) -> Option<()> {
        loop {
            let rest = &self.b[self.i..];
            let k = memchr::memchr2(b'"', b'\\', rest)?;
            if rest[..k].iter().fold(false, |bad, &c| bad | (c < 0x20)) {
                return None;
            }
            self.i += k + 1;
            if rest[k] == b'"' {
                return Some(());
            }
            match *self.b.get(self.i)? {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.i += 1,
                b'u' => {
                    self.i += 1;
                    self.hex4()?;
                }
                _ => return None,
            }
        }
    }

    /// One value that is not kept, `depth` levels below the top-level object.
    fn skip_value(&mut self, depth: usize) -> Option<()> {
        self.ws();
        match *self.b.get(self.i)? {
            b'"' => {
                self.i += 1;
                self.skip_string()
            }
            open @ (b'{' | b'[') => {
                if depth >= MAX_DEPTH {
                    return None;
                }
                self.i += 1;
                let close = if open == b'{' { b'}' } else { b']' };
                self.ws();
                if self.eat(close).is_some() {
                    return Some(());
                }
                loop {
                    if open == b'{' {
                        self.ws();
                        self.eat(b'"')?;
                        self.skip_string()?;
                        self.ws();
                        self.eat(b':')?;
                    }
                    self.skip_value(depth + 1)?;
                    self.ws();
                    if self.eat(b',').is_some() {
                        continue;
                    }
                    return self.eat(close);
                }
            }
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    /// `true`, `false` or `null`.
    fn literal(&mut self, word: &[u8]) -> Option<()> {
        (self.b.get(self.i..self.i + word.len())? == word).then(|| self.i += word.len())
    }

    /// A number: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
    fn number(&mut self) -> Option<()> {
        let _ = self.eat(b'-');
        let digits = |r: &mut Self| {
            let s = r.i;
            while r.b.get(r.i).is_some_and(u8::is_ascii_digit) {
                r.i += 1;
            }
            r.i - s
        };
        match self.b.get(self.i)? {
            b'0' => {
                self.i += 1;
                if self.b.get(self.i).is_some_and(u8::is_ascii_digit) {
                    return None; // a leading zero
                }
            }
            b'1'..=b'9' => {
                digits(self);
            }
            _ => return None,
        }
        if self.eat(b'.').is_some() && digits(self) == 0 {
            return None;
        }
        if let Some(b'e' | b'E') = self.b.get(self.i) {
            self.i += 1;
            if let Some(b'+' | b'-') = self.b.get(self.i) {
                self.i += 1;
            }
            if digits(self) == 0 {
                return None;
            }
        }
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `json_text_into` on `line`, against serde_json's reading of it.
    fn same(line: &[u8], key: &str) {
        let mut out = String::from("left over");
        let got = json_text_into(line, key, &mut out).map(|()| out);
        let want = json_text(line, key).map(|t| t.into_owned());
        assert_eq!(got, want, "{:?}", String::from_utf8_lossy(line));
    }

    #[test]
    fn reads_what_serde_json_reads() {
        for line in [
            &br#"{"id": "12", "text": "Anarchism\n\nis \"a\" political\/philosophy\t\u00e9\u4e2d\ud83d\ude00."}"#[..],
            br#"  {"text":"plain"}  "#,
            br#"{"text": ""}"#,
            br#"{"a": [1, -2.5e+3, 0, 0.1, 1E9, true, false, null, {"b": [[]], "c": {}}], "text": "x"}"#,
            br#"{"text": "first", "text": 5}"#,
            br#"{"te\u0078t": "escaped key"}"#,
            br#"{"other": "\ud800 lone in an ignored string", "text": "ok"}"#,
            "{\"text\": \"h\u{e9}llo \u{1F600} raw UTF-8\"}".as_bytes(),
            b"{\"text\": \"a\\u0000b\\u001f\"}\r",
            b"{\"other\": \"\xff not UTF-8 but ignored\", \"text\": \"ok\"}",
        ] {
            same(line, "text");
        }
    }

    #[test]
    fn bad_lines_get_serde_json_s_error() {
        for line in [
            &br#"{"id": 1}"#[..],
            br#"{"text": 5}"#,
            br#"{"text": ["a"]}"#,
            br#"{"text": "a""#,
            br#"{"text": "a"} x"#,
            br#"{"text": "a",}"#,
            br#"{"text": "\ud800"}"#,
            br#"{"text": "\udc00"}"#,
            br#"{"text": "\ud800\u0041"}"#,
            br#"{"text": "\x"}"#,
            br#"{"text": "\u12g4"}"#,
            br#"{"a": 01, "text": "x"}"#,
            br#"{"a": 1., "text": "x"}"#,
            br#"{"a": -, "text": "x"}"#,
            br#"{"a": tru, "text": "x"}"#,
            br#"{"a": [1,], "text": "x"}"#,
            br#"["text", "x"]"#,
            b"{\"text\": \"\xff\"}",
            b"{\"text\": \"a\nb\"}",
            b"{\"\xff\": 1, \"text\": \"x\"}",
            b"",
            b"{",
        ] {
            same(line, "text");
            assert!(json_text(line, "text").is_err(), "{:?}", String::from_utf8_lossy(line));
        }
    }

    #[test]
    fn deep_nesting_is_left_to_serde_json() {
        let deep = |n: usize| format!(r#"{{"a": {}1{}, "text": "x"}}"#, "[".repeat(n), "]".repeat(n));
        for n in [MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, 1000] {
            same(deep(n).as_bytes(), "text");
        }
    }

    #[test]
    fn another_key_and_a_reused_buffer() {
        let mut out = String::with_capacity(64);
        json_text_into(br#"{"body": "one", "text": "two"}"#, "body", &mut out).unwrap();
        assert_eq!(out, "one");
        json_text_into(br#"{"text": "three"}"#, "text", &mut out).unwrap();
        assert_eq!(out, "three");
        let e = json_text_into(br#"{"text": "three"}"#, "body", &mut out).unwrap_err();
        assert!(e.contains("no key `body`"), "{e}");
    }
}
