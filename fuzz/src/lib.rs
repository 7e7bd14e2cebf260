//! Helpers shared by the fuzz targets: a deterministic way to cut one input into pieces, so a
//! target can feed the same bytes in one call and in many and compare the results.
//!
//! The cuts are derived from the input itself (an FNV-1a hash), not taken from a prefix of it:
//! the seed corpus stays plain, realistic documents (a request head, a chunked body, an event
//! stream), and any input replays exactly.

/// FNV-1a over `data`: the seed of [`Cuts`].
pub fn fnv1a(data: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in data {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// Piece lengths for cutting an input of `len` bytes: each 1 to `piece_bytes_max`, from a
/// xorshift generator seeded by the input's hash. Small pieces are favoured, so reads that end
/// inside a line ending or a length prefix are common.
pub struct Cuts {
    state: u64,
    piece_bytes_max: usize,
}

impl Cuts {
    pub fn new(data: &[u8], piece_bytes_max: usize) -> Cuts {
        Cuts {
            state: fnv1a(data) | 1,
            piece_bytes_max: piece_bytes_max.max(1),
        }
    }

    /// The next pseudo-random value.
    pub fn next_u64(&mut self) -> u64 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        self.state
    }

    /// The next piece length, 1 to `piece_bytes_max`.
    pub fn next_len(&mut self) -> usize {
        let roll = self.next_u64();
        // Half the pieces are 1 to 4 bytes, the rest up to the maximum.
        let max = if roll & 1 == 0 {
            4.min(self.piece_bytes_max)
        } else {
            self.piece_bytes_max
        };
        1 + ((roll >> 1) % max as u64) as usize
    }

    /// `data` cut into consecutive pieces that together are exactly `data`.
    pub fn split<'d>(&mut self, data: &'d [u8]) -> Vec<&'d [u8]> {
        let mut pieces = Vec::new();
        let mut rest = data;
        while !rest.is_empty() {
            let take = self.next_len().min(rest.len());
            let (piece, after) = rest.split_at(take);
            pieces.push(piece);
            rest = after;
        }
        pieces
    }
}

/// A socket replayed from bytes: reads hand out `input`, writes are accepted and kept in
/// `written`. Once `input` is read, a read ends the stream ([`Wire::new`]) or stays pending like
/// an idle peer ([`Wire::idle_at_end`]); it never waits otherwise, so a future driving it makes
/// all the progress it can in one poll.
pub struct Wire {
    input: Vec<u8>,
    read_bytes: usize,
    /// After `input`: `Pending` instead of end of stream.
    idle_at_end: bool,
    pub written: Vec<u8>,
    /// Most bytes `written` keeps; the rest is dropped (a peer that never reads).
    written_bytes_max: usize,
}

impl Wire {
    /// A peer that closes after `input`.
    pub fn new(input: Vec<u8>) -> Wire {
        Wire {
            input,
            read_bytes: 0,
            idle_at_end: false,
            written: Vec::new(),
            written_bytes_max: 64 * 1024,
        }
    }

    /// A peer that stays connected and silent after `input`. HTTP/2 servers need it: h2 drops
    /// the requests it has not handed out yet when the socket closes.
    pub fn idle_at_end(input: Vec<u8>) -> Wire {
        Wire {
            idle_at_end: true,
            ..Wire::new(input)
        }
    }

    /// Bytes of `input` read so far.
    pub fn read_bytes(&self) -> usize {
        self.read_bytes
    }
}

impl tokio::io::AsyncRead for Wire {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        _context: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let start = self.read_bytes;
        if start == self.input.len() && self.idle_at_end {
            return std::task::Poll::Pending;
        }
        let take = (self.input.len() - start).min(buf.remaining());
        buf.put_slice(&self.input[start..start + take]);
        self.read_bytes += take;
        std::task::Poll::Ready(Ok(()))
    }
}

impl tokio::io::AsyncWrite for Wire {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _context: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let room = self.written_bytes_max.saturating_sub(self.written.len());
        let keep = buf.len().min(room);
        self.written.extend_from_slice(&buf[..keep]);
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _context: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _context: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// Runs `future` to completion on a current-thread runtime built once per process.
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("a current-thread runtime")
        })
        .block_on(future)
}
