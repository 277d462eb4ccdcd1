//! The server's frame splitting (`oncelog_broker::protocol::server::read_frame`): an
//! arbitrary TCP stream, delivered in arbitrary chunk sizes, must split into
//! exactly the frames a one-shot reference split finds, whatever the chunking,
//! and stop the same way (clean end, size out of bounds, or cut mid-frame).
//!
//! Input: `[max selector][n][n chunk-size bytes][stream...]`.
#![no_main]

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use libfuzzer_sys::fuzz_target;
use oncelog_broker::protocol::server::read_frame;
use oncelog_fuzz::{block_on, reference_split as reference, End};
use tokio::io::{AsyncRead, ReadBuf};

/// Frame size limits to try; 104857600 is the `socket.request.max.bytes` default.
const MAXES: [usize; 6] = [0, 8, 61, 4096, 1 << 20, 104_857_600];

/// Hands out `data` in the given chunk sizes (cycled), then ends with EOF
/// or with an I/O error.
struct Chunked<'a> {
    data: &'a [u8],
    sizes: &'a [u8],
    next: usize,
    error_at_end: bool,
}

impl AsyncRead for Chunked<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.data.is_empty() {
            if self.error_at_end {
                return Poll::Ready(Err(io::ErrorKind::ConnectionReset.into()));
            }
            return Poll::Ready(Ok(()));
        }
        let s = if self.sizes.is_empty() {
            0xff
        } else {
            self.sizes[self.next % self.sizes.len()]
        };
        self.next += 1;
        // Small chunks byte by byte, large ones in KiB steps.
        let want = if s & 0x80 == 0 {
            s as usize + 1
        } else {
            ((s & 0x7f) as usize + 1) * 1024
        };
        let n = want.min(buf.remaining()).min(self.data.len());
        let (now, rest) = self.data.split_at(n);
        buf.put_slice(now);
        self.data = rest;
        Poll::Ready(Ok(()))
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let Some((&n, rest)) = rest.split_first() else {
        return;
    };
    let n = (n as usize).min(rest.len());
    let (sizes, stream) = rest.split_at(n);
    let max = MAXES[(sel & 0x7f) as usize % MAXES.len()];
    let (want, want_end) = reference(stream, max);

    let mut rd = Chunked {
        data: stream,
        sizes,
        next: 0,
        error_at_end: sel & 0x80 != 0,
    };
    let mut got = 0usize;
    let end = loop {
        match block_on(read_frame(&mut rd, max)) {
            Ok(Some(frame)) => {
                assert!(frame.len() <= max, "frame over the limit");
                assert!(got < want.len(), "more frames than the reference split");
                assert_eq!(&frame[..], want[got], "frame {got} differs");
                got += 1;
            }
            Ok(None) => break End::Clean,
            Err(e) => break End::Error(e),
        }
    };
    assert_eq!(got, want.len(), "frame count differs");
    assert_eq!(end, want_end, "the stream ended differently");
});
