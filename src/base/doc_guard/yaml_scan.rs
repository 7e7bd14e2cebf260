//! The YAML scanner of [`super::yaml_depth_exceeds`]: libyaml's `scanner.c` followed closely
//! enough to know where libyaml opens a collection (see the parent module's "Architecture").
//! Names follow libyaml's so the two can be read side by side.
//!
//! Bounds: one pass over the bytes; the stacks of open block collections, flow levels and simple
//! keys grow with the nesting and stop growing at the limit the scan is run with.

/// How far apart libyaml lets a simple key and its `:` be, in bytes (`scanner.c`,
/// `stale_simple_keys`).
const SIMPLE_KEY_BYTES_MAX: usize = 1024;

/// libyaml's `yaml_simple_key_t`: a token that may turn out to be a mapping key when a `:`
/// follows on the same line within [`SIMPLE_KEY_BYTES_MAX`] bytes.
#[derive(Debug, Clone, Copy, Default)]
struct SimpleKey {
    possible: bool,
    line: usize,
    column: isize,
    /// Byte offset of the key's first character.
    index: usize,
}

pub(super) struct YamlScan<'a> {
    text: &'a [u8],
    /// Byte offset of the next character: libyaml's `mark.index` (a byte offset into its UTF-8
    /// buffer; a constant shift from this one when a byte-order mark was stripped).
    pos: usize,
    /// libyaml's mark: 0-based line and column (in characters).
    line: usize,
    column: isize,
    flow_level: usize,
    /// Column of the innermost block collection; -1 at the root.
    indent: isize,
    /// The open block collections, innermost last (libyaml keeps only their indents).
    blocks: Vec<Block>,
    /// The deepest nesting seen so far.
    pub(super) max_depth: usize,
    simple_key_allowed: bool,
    /// One per flow level, plus one for the block context.
    simple_keys: Vec<SimpleKey>,
    /// One per flow level: the open `[…]` and `{…}`, innermost last.
    flows: Vec<Flow>,
    /// The deepest nesting reached since the block context's simple key was saved: a block
    /// mapping opened at its `:` wraps that key (`[[x]]: 1` nests three deep).
    block_key_depth_max: usize,
    limit: usize,
    pub(super) too_deep_at: Option<usize>,
    pub(super) aliases: usize,
}

impl<'a> YamlScan<'a> {
    pub(super) fn run(text: &'a [u8], limit: usize) -> YamlScan<'a> {
        let mut scan = YamlScan {
            text,
            pos: 0,
            line: 0,
            column: 0,
            flow_level: 0,
            indent: -1,
            blocks: Vec::new(),
            max_depth: 0,
            simple_key_allowed: true,
            simple_keys: vec![SimpleKey::default()],
            flows: Vec::new(),
            block_key_depth_max: 0,
            limit,
            too_deep_at: None,
            aliases: 0,
        };
        // The reader strips a leading byte-order mark before the scanner sees anything.
        if text.starts_with(BOM) {
            scan.pos = BOM.len();
        }
        while scan.too_deep_at.is_none() && scan.fetch_next_token() {}
        scan
    }

    // --- characters -------------------------------------------------------------------------

    fn byte_at(&self, offset: usize) -> Option<u8> {
        self.text.get(self.pos + offset).copied()
    }

    fn check(&self, byte: u8) -> bool {
        self.byte_at(0) == Some(byte)
    }

    fn check_at(&self, byte: u8, offset: usize) -> bool {
        self.byte_at(offset) == Some(byte)
    }

    fn at_end(&self) -> bool {
        self.pos >= self.text.len()
    }

    /// Length in bytes of the line break at `pos + offset`, if there is one: `\r\n`, `\r`, `\n`,
    /// NEL, LS, PS (libyaml's `IS_BREAK`).
    fn break_len_at(&self, offset: usize) -> Option<usize> {
        let rest = self.text.get(self.pos + offset..)?;
        match rest {
            [b'\r', b'\n', ..] => Some(2),
            [b'\r', ..] | [b'\n', ..] => Some(1),
            [0xC2, 0x85, ..] => Some(2),
            [0xE2, 0x80, 0xA8, ..] | [0xE2, 0x80, 0xA9, ..] => Some(3),
            _ => None,
        }
    }

    fn is_break(&self) -> bool {
        self.break_len_at(0).is_some()
    }

    fn is_blank_at(&self, offset: usize) -> bool {
        matches!(self.byte_at(offset), Some(b' ' | b'\t'))
    }

    fn is_blank(&self) -> bool {
        self.is_blank_at(0)
    }

    /// Blank, line break or end of input (libyaml's `IS_BLANKZ`).
    fn is_blankz_at(&self, offset: usize) -> bool {
        self.pos + offset >= self.text.len()
            || self.is_blank_at(offset)
            || self.break_len_at(offset).is_some()
    }

    fn is_breakz(&self) -> bool {
        self.at_end() || self.is_break()
    }

    fn is_alpha(&self) -> bool {
        matches!(
            self.byte_at(0),
            Some(b'0'..=b'9' | b'A'..=b'Z' | b'a'..=b'z' | b'_' | b'-')
        )
    }

    /// Moves past one character (libyaml's `SKIP`).
    fn skip(&mut self) {
        let Some(&lead) = self.text.get(self.pos) else {
            return;
        };
        let width = match lead {
            0x00..=0x7F => 1,
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            _ => 4,
        };
        self.pos = (self.pos + width).min(self.text.len());
        self.column += 1;
    }

    /// Moves past one line break, `\r\n` counting as one (libyaml's `SKIP_LINE`).
    fn skip_line(&mut self) {
        if let Some(length) = self.break_len_at(0) {
            self.pos += length;
            self.column = 0;
            self.line += 1;
        }
    }

    fn is_document_indicator(&self) -> bool {
        self.column == 0
            && ((self.check(b'-') && self.check_at(b'-', 1) && self.check_at(b'-', 2))
                || (self.check(b'.') && self.check_at(b'.', 1) && self.check_at(b'.', 2)))
            && self.is_blankz_at(3)
    }

    // --- nesting ------------------------------------------------------------------------------

    /// Collections open here: every block collection, the sequences written without indentation
    /// under a mapping key (`key:` then `- item` in the key's column, which libyaml opens without
    /// an indent of their own), every flow collection, and the single-pair mappings inside flow
    /// sequences (`[key: value]`).
    fn depth(&self) -> usize {
        let indentless = self.blocks.iter().filter(|block| block.indentless).count();
        let pairs = self.flows.iter().filter(|flow| flow.pair).count();
        self.blocks.len() + indentless + self.flow_level + pairs
    }

    fn check_depth(&mut self) {
        self.reach(self.depth());
    }

    /// Nesting `depth` exists in the document (now, or around what was scanned since the current
    /// entry of some flow sequence began).
    fn reach(&mut self, depth: usize) {
        self.max_depth = self.max_depth.max(depth);
        self.block_key_depth_max = self.block_key_depth_max.max(depth);
        for flow in &mut self.flows {
            flow.entry_depth_max = flow.entry_depth_max.max(depth);
        }
        if depth > self.limit && self.too_deep_at.is_none() {
            self.too_deep_at = Some(self.line + 1);
        }
    }

    /// A `?` or `:` in a flow sequence makes its current entry a single-pair mapping (libyaml's
    /// `parse_flow_sequence_entry` on a KEY token), which also wraps the key scanned before it.
    fn flow_pair(&mut self) {
        let Some(flow) = self.flows.last_mut() else {
            return;
        };
        if !flow.sequence || flow.pair {
            return;
        }
        flow.pair = true;
        let key_depth_max = flow.entry_depth_max;
        self.reach(key_depth_max + 1);
        self.check_depth();
    }

    /// A `,` starts the next entry of the innermost flow collection.
    fn next_flow_entry(&mut self) {
        if let Some(flow) = self.flows.last_mut() {
            flow.pair = false;
        }
        let depth = self.depth();
        if let Some(flow) = self.flows.last_mut() {
            flow.entry_depth_max = depth;
        }
    }

    /// Opens a block collection at `column` unless one is open there already; true if it did.
    fn roll_indent(&mut self, column: isize, mapping: bool) -> bool {
        if self.flow_level != 0 || self.indent >= column {
            return false;
        }
        self.blocks.push(Block {
            outer_indent: self.indent,
            mapping,
            indentless: false,
        });
        self.indent = column;
        self.check_depth();
        true
    }

    fn unroll_indent(&mut self, column: isize) {
        if self.flow_level != 0 {
            return;
        }
        while self.indent > column {
            self.indent = self.blocks.pop().map_or(-1, |block| block.outer_indent);
        }
    }

    /// A token in the column of the innermost block mapping opens an indentless sequence when it
    /// is a `-` entry, and closes one otherwise (libyaml's `parse_indentless_sequence_entry`).
    fn track_indentless_sequence(&mut self, block_entry: bool) {
        if self.flow_level != 0 || self.indent != self.column {
            return;
        }
        let Some(block) = self.blocks.last_mut() else {
            return;
        };
        if block.mapping {
            block.indentless = block_entry;
            if block_entry {
                self.check_depth();
            }
        }
    }

    fn increase_flow_level(&mut self, sequence: bool) {
        self.simple_keys.push(SimpleKey::default());
        self.flow_level += 1;
        self.flows.push(Flow {
            sequence,
            pair: false,
            entry_depth_max: 0,
        });
        self.check_depth();
    }

    fn decrease_flow_level(&mut self) {
        if self.flow_level != 0 {
            self.flow_level -= 1;
            self.simple_keys.pop();
            self.flows.pop();
        }
    }

    // --- simple keys (libyaml errors on a required key are not modelled: see the module doc) --

    fn top_key(&mut self) -> &mut SimpleKey {
        self.simple_keys
            .last_mut()
            .expect("the block context's simple key slot is never popped")
    }

    fn stale_simple_keys(&mut self) {
        let (line, index) = (self.line, self.pos);
        for key in &mut self.simple_keys {
            if key.possible && (key.line < line || key.index + SIMPLE_KEY_BYTES_MAX < index) {
                key.possible = false;
            }
        }
    }

    fn save_simple_key(&mut self) {
        if self.simple_key_allowed {
            if self.flow_level == 0 {
                self.block_key_depth_max = self.depth();
            }
            let key = SimpleKey {
                possible: true,
                line: self.line,
                column: self.column,
                index: self.pos,
            };
            *self.top_key() = key;
        }
    }

    fn remove_simple_key(&mut self) {
        self.top_key().possible = false;
    }

    // --- tokens -------------------------------------------------------------------------------

    /// One token, as `yaml_parser_fetch_next_token`; false at the end of the input.
    fn fetch_next_token(&mut self) -> bool {
        self.scan_to_next_token();
        self.stale_simple_keys();
        self.unroll_indent(self.column);
        if self.at_end() {
            return false;
        }
        let flow = self.flow_level != 0;
        let next_blankz = self.is_blankz_at(1);
        self.track_indentless_sequence(self.check(b'-') && next_blankz);
        match self.byte_at(0) {
            Some(b'%') if self.column == 0 => {
                // A directive takes its whole line, line break included (`scan_directive`), so
                // the next line starts with simple keys still disallowed.
                self.document_boundary();
                while !self.is_breakz() {
                    self.skip();
                }
                self.skip_line();
            }
            _ if self.is_document_indicator() => {
                self.document_boundary();
                for _ in 0..3 {
                    self.skip();
                }
            }
            Some(byte @ (b'[' | b'{')) => {
                self.save_simple_key();
                self.increase_flow_level(byte == b'[');
                self.simple_key_allowed = true;
                self.skip();
            }
            Some(b']' | b'}') => {
                self.remove_simple_key();
                self.decrease_flow_level();
                self.simple_key_allowed = false;
                self.skip();
            }
            Some(b',') => {
                self.next_flow_entry();
                self.remove_simple_key();
                self.simple_key_allowed = true;
                self.skip();
            }
            Some(b'-') if next_blankz => {
                self.roll_indent(self.column, false);
                self.remove_simple_key();
                self.simple_key_allowed = true;
                self.skip();
            }
            Some(b'?') if flow || next_blankz => {
                self.flow_pair();
                self.roll_indent(self.column, true);
                self.remove_simple_key();
                self.simple_key_allowed = !flow;
                self.skip();
            }
            Some(b':') if flow || next_blankz => {
                self.flow_pair();
                let key = *self.top_key();
                if key.possible {
                    let key_depth_max = self.block_key_depth_max;
                    if self.roll_indent(key.column, true) {
                        self.reach(key_depth_max + 1);
                    }
                    self.top_key().possible = false;
                    self.simple_key_allowed = false;
                } else {
                    self.roll_indent(self.column, true);
                    self.simple_key_allowed = !flow;
                }
                self.skip();
            }
            Some(byte @ (b'*' | b'&')) => {
                self.save_simple_key();
                self.simple_key_allowed = false;
                if byte == b'*' {
                    self.aliases += 1;
                }
                self.skip();
                while self.is_alpha() {
                    self.skip();
                }
            }
            Some(b'!') => {
                self.save_simple_key();
                self.simple_key_allowed = false;
                self.scan_tag();
            }
            Some(b'|' | b'>') if !flow => {
                self.remove_simple_key();
                self.simple_key_allowed = true;
                self.scan_block_scalar();
            }
            Some(quote @ (b'\'' | b'"')) => {
                self.save_simple_key();
                self.simple_key_allowed = false;
                self.scan_flow_scalar(quote == b'\'');
            }
            Some(byte) if starts_plain_scalar(byte, self.byte_at(1), flow, next_blankz) => {
                self.save_simple_key();
                self.simple_key_allowed = false;
                if self.scan_plain_scalar() {
                    self.simple_key_allowed = true;
                }
            }
            // libyaml: "found character that cannot start any token", and it stops. Carrying on
            // past it can only see more than libyaml would.
            Some(_) | None => self.skip(),
        }
        true
    }

    /// `---`, `...` or a directive: every block closes.
    fn document_boundary(&mut self) {
        self.unroll_indent(-1);
        self.remove_simple_key();
        self.simple_key_allowed = false;
    }

    fn scan_to_next_token(&mut self) {
        loop {
            if self.column == 0 && self.text[self.pos..].starts_with(BOM) {
                self.skip();
            }
            while self.check(b' ')
                || ((self.flow_level != 0 || !self.simple_key_allowed) && self.check(b'\t'))
            {
                self.skip();
            }
            if self.check(b'#') {
                while !self.is_breakz() {
                    self.skip();
                }
            }
            if !self.is_break() {
                return;
            }
            self.skip_line();
            if self.flow_level == 0 {
                self.simple_key_allowed = true;
            }
        }
    }

    /// `!tag`, `!!tag`, `!handle!suffix`, `!<verbatim>`: `!` then URI characters.
    fn scan_tag(&mut self) {
        self.skip();
        let verbatim = self.check(b'<');
        if verbatim {
            self.skip();
        }
        while self
            .byte_at(0)
            .is_some_and(|byte| is_uri_char(byte, verbatim))
        {
            self.skip();
        }
        if verbatim && self.check(b'>') {
            self.skip();
        }
    }

    /// A single- or double-quoted scalar, from its opening quote past its closing one.
    fn scan_flow_scalar(&mut self, single: bool) {
        self.skip();
        loop {
            if self.is_document_indicator() || self.at_end() {
                return; // libyaml: an error; nothing after it is parsed
            }
            match self.byte_at(0) {
                Some(b'\'') if single && self.check_at(b'\'', 1) => {
                    self.skip();
                    self.skip();
                }
                Some(b'\'') if single => {
                    self.skip();
                    return;
                }
                Some(b'"') if !single => {
                    self.skip();
                    return;
                }
                Some(b'\\') if !single => {
                    self.skip();
                    if self.is_break() {
                        self.skip_line();
                    } else {
                        self.skip();
                    }
                }
                _ if self.is_break() => self.skip_line(),
                _ => self.skip(),
            }
        }
    }

    /// A plain scalar; true when it ended after a line break (libyaml then allows a simple key).
    fn scan_plain_scalar(&mut self) -> bool {
        let indent = self.indent + 1;
        let flow = self.flow_level != 0;
        let mut leading_blanks = false;
        loop {
            if self.is_document_indicator() || self.check(b'#') {
                break;
            }
            while !self.is_blankz_at(0) {
                let byte = self.byte_at(0);
                let next = self.byte_at(1);
                if flow
                    && byte == Some(b':')
                    && matches!(next, Some(b',' | b'?' | b'[' | b']' | b'{' | b'}'))
                {
                    return leading_blanks; // libyaml: "found unexpected ':'"
                }
                if (byte == Some(b':') && self.is_blankz_at(1))
                    || (flow && matches!(byte, Some(b',' | b'[' | b']' | b'{' | b'}')))
                {
                    break;
                }
                leading_blanks = false;
                self.skip();
            }
            if !(self.is_blank() || self.is_break()) {
                break;
            }
            while self.is_blank() || self.is_break() {
                if self.is_blank() {
                    self.skip();
                } else {
                    self.skip_line();
                    leading_blanks = true;
                }
            }
            if !flow && self.column < indent {
                break;
            }
        }
        leading_blanks
    }

    /// `|` or `>` with its header, then every line of its content.
    fn scan_block_scalar(&mut self) {
        self.skip();
        let mut increment: isize = 0;
        for _ in 0..2 {
            match self.byte_at(0) {
                Some(b'+' | b'-') => self.skip(),
                Some(digit @ b'1'..=b'9') if increment == 0 => {
                    increment = isize::from(digit - b'0');
                    self.skip();
                }
                _ => break,
            }
        }
        while self.is_blank() {
            self.skip();
        }
        if self.check(b'#') {
            while !self.is_breakz() {
                self.skip();
            }
        }
        // libyaml refuses anything else before the line break; carrying on is harmless.
        self.skip_line();
        let mut indent = if increment == 0 {
            0
        } else if self.indent >= 0 {
            self.indent + increment
        } else {
            increment
        };
        self.block_scalar_breaks(&mut indent);
        while self.column == indent && !self.at_end() {
            while !self.is_breakz() {
                self.skip();
            }
            self.skip_line();
            self.block_scalar_breaks(&mut indent);
        }
    }

    /// Empty lines and indentation before a block scalar's next content line; settles the
    /// content indentation on the first call when the header did not give it.
    fn block_scalar_breaks(&mut self, indent: &mut isize) {
        let mut max_indent: isize = 0;
        loop {
            while (*indent == 0 || self.column < *indent) && self.check(b' ') {
                self.skip();
            }
            max_indent = max_indent.max(self.column);
            if !self.is_break() {
                break;
            }
            self.skip_line();
        }
        if *indent == 0 {
            *indent = max_indent.max(self.indent + 1).max(1);
        }
    }
}

/// An open flow collection.
#[derive(Debug, Clone, Copy)]
struct Flow {
    /// `[…]`, where a `key: value` entry is a mapping of its own.
    sequence: bool,
    /// The current entry is such a single-pair mapping.
    pair: bool,
    /// The deepest nesting reached inside the current entry, this collection's level included.
    entry_depth_max: usize,
}

/// An open block collection.
#[derive(Debug, Clone, Copy)]
struct Block {
    /// The indent to return to when it closes.
    outer_indent: isize,
    mapping: bool,
    /// A sequence without indentation of its own is open in this mapping's column.
    indentless: bool,
}

const BOM: &[u8] = &[0xEF, 0xBB, 0xBF];

/// What may start a plain scalar (libyaml's condition at the end of `fetch_next_token`).
fn starts_plain_scalar(byte: u8, next: Option<u8>, flow: bool, next_blankz: bool) -> bool {
    let indicator = matches!(
        byte,
        b'-' | b'?'
            | b':'
            | b','
            | b'['
            | b']'
            | b'{'
            | b'}'
            | b'#'
            | b'&'
            | b'*'
            | b'!'
            | b'|'
            | b'>'
            | b'\''
            | b'"'
            | b'%'
            | b'@'
            | b'`'
            | b' '
            | b'\t'
            | b'\r'
            | b'\n'
    );
    let next_is_blank = matches!(next, Some(b' ' | b'\t'));
    !indicator
        || (byte == b'-' && !next_is_blank)
        || (!flow && matches!(byte, b'?' | b':') && !next_blankz)
}

/// Characters of a tag's URI (libyaml's `scan_tag_uri`); `,[]` only inside `!<…>`.
fn is_uri_char(byte: u8, verbatim: bool) -> bool {
    byte.is_ascii_alphanumeric()
        || matches!(
            byte,
            b'_' | b'-'
                | b';'
                | b'/'
                | b'?'
                | b':'
                | b'@'
                | b'&'
                | b'='
                | b'+'
                | b'$'
                | b'.'
                | b'%'
                | b'!'
                | b'~'
                | b'*'
                | b'\''
                | b'('
                | b')'
        )
        || (verbatim && matches!(byte, b',' | b'[' | b']'))
}
