//! Makes the registration socket accept what kubelet's plugin watcher really sends.
//!
//! The plugin watcher dials the registration socket with the bare socket path as its gRPC target
//! (`grpc.DialContext("/var/lib/kubelet/plugins_registry/x-reg.sock", ...)`), so grpc-go sends
//! the percent-encoded path as the HTTP/2 `:authority`. h2, under tonic, refuses an authority
//! that is not a valid URI authority and resets the stream (hyperium/h2#487), and kubelet gives
//! up with `failed to get plugin info using RPC GetInfo`. Kubernetes worked around the same for
//! CSI and device plugins on the client side (kubernetes/kubernetes#112597); DRA plugins are
//! still dialled this way.
//!
//! [`NormalizeAuthority`] sits between the accepted connection and the gRPC server. It passes
//! every client frame through untouched except request header blocks, which it decodes (HPACK,
//! tracking the client's dynamic table), gives `:authority: localhost` (what gRPC sends for a
//! `unix:` target) when the value is not a valid authority, and re-encodes as literals without
//! indexing. The server's decoder therefore never depends on the client's dynamic table, and
//! the server's replies are not touched at all.
//!
//! It buffers and decodes no more than that server accepts: a frame over its maximum frame size,
//! a header list at its maximum header list size, a dynamic table size update over its table
//! size or an oversized or endless header block closes that one connection, with one warning.
//!
//! One file (over 900 lines, half of them tests): the frame rewriter reads as one state machine,
//! and its tests feed it frame by frame.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use loona_hpack::{Decoder, decoder::DecoderError, encoder::encode_integer_into};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// What kubelet's DRA manager sends for `unix:` targets; any valid authority would do.
const REPLACEMENT_AUTHORITY: &[u8] = b"localhost";
const CLIENT_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER_LEN: usize = 9;
const FRAME_HEADERS: u8 = 0x1;
const FRAME_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
const PRIORITY_LEN: usize = 5;

// The limits of the server behind us. The registration socket's server is a plain
// `tonic::transport::Server::builder()`: tonic 0.14 leaves `max_frame_size` and
// `http2_max_header_list_size` unset, so hyper 1.x's server defaults reach h2 (16 KiB frames,
// 16 KiB header lists) and `header_table_size` stays unset, so h2 keeps HPACK's 4096 bytes.
// Refusing exactly what that server refuses means we never drop a request it would serve, and
// never buffer or decode more than it would accept. Change these with that builder.

/// SETTINGS_MAX_FRAME_SIZE as the server advertises it (hyper's `DEFAULT_MAX_FRAME_SIZE`, also
/// the protocol's initial value): larger frames are a FRAME_SIZE_ERROR there, so we refuse them
/// from their 9-byte header instead of buffering the payload. Our own frames stay within it.
const MAX_FRAME_SIZE: usize = 16_384;
/// SETTINGS_MAX_HEADER_LIST_SIZE as the server advertises it (hyper's
/// `DEFAULT_SETTINGS_MAX_HEADER_LIST_SIZE`; h2's own default is 16 MiB but hyper overrides it).
/// Counted as RFC 9113 §6.5.2 says, over the list the server would decode, i.e. after our
/// rewrite. h2 answers a list *reaching* the limit (`>=`) with 431, so we refuse from there too.
const MAX_HEADER_LIST_SIZE: usize = 16 * 1024;
/// RFC 9113 §6.5.2's per-entry overhead in the header list size.
const HEADER_ENTRY_OVERHEAD: usize = 32;
/// SETTINGS_HEADER_TABLE_SIZE as the server advertises it: h2 sends none, so the initial 4096.
/// A client's dynamic table size update above it is a COMPRESSION_ERROR (RFC 7541 §4.2, §6.3).
const MAX_HEADER_TABLE_SIZE: usize = 4096;
/// The encoded header block (HEADERS and CONTINUATION fragments, padding and priority removed)
/// we buffer before decoding. Encoded is not always smaller than decoded: a Huffman code is up
/// to 30 bits per octet (RFC 7541 Appendix B), so a list under [`MAX_HEADER_LIST_SIZE`] can take
/// up to 3.75 times as many bytes. Four times the list limit admits every such list and is the
/// factor h2 itself tolerates before it calls a list an abuse (`MAX_HEADER_LIST_ABUSE_MULTIPLIER`).
const MAX_HEADER_BLOCK: usize = 4 * MAX_HEADER_LIST_SIZE;
/// CONTINUATION frames without END_HEADERS that one block may have, as h2 computes it
/// (`calc_max_continuation_frames`: list limit / frame size plus a quarter, at least 5). Empty
/// fragments would never reach [`MAX_HEADER_BLOCK`], so a flood of them is counted instead.
const MAX_CONTINUATION_FRAMES: usize = {
    let frames_for_list = if MAX_HEADER_LIST_SIZE / MAX_FRAME_SIZE > 1 {
        MAX_HEADER_LIST_SIZE / MAX_FRAME_SIZE
    } else {
        1
    };
    let with_padding = frames_for_list + (frames_for_list >> 2);
    if with_padding > 5 { with_padding } else { 5 }
};

/// Why a client's byte stream could not be rewritten; the connection is closed.
#[derive(Debug, thiserror::Error)]
pub enum RewriteError {
    #[error("the client did not start with the HTTP/2 connection preface")]
    Preface,
    #[error(
        "frame of type {kind:#x} and {len} bytes on stream {stream} is larger than the \
         server's SETTINGS_MAX_FRAME_SIZE of {MAX_FRAME_SIZE}"
    )]
    FrameTooLarge { kind: u8, stream: u32, len: usize },
    #[error("HEADERS frame on stream {stream} has invalid padding or priority fields")]
    MalformedHeaders { stream: u32 },
    #[error("a {kind:#x} frame interrupted the header block of stream {stream}")]
    InterruptedHeaderBlock { kind: u8, stream: u32 },
    #[error("header block of stream {stream} is larger than {MAX_HEADER_BLOCK} bytes")]
    HeaderBlockTooLarge { stream: u32 },
    #[error(
        "header block of stream {stream} has more than {MAX_CONTINUATION_FRAMES} CONTINUATION \
         frames before END_HEADERS"
    )]
    TooManyContinuations { stream: u32 },
    #[error(
        "decoded header list of stream {stream} has {size} bytes, not under the server's \
         SETTINGS_MAX_HEADER_LIST_SIZE of {MAX_HEADER_LIST_SIZE}"
    )]
    HeaderListTooLarge { stream: u32, size: usize },
    #[error(
        "header block of stream {stream} resizes the HPACK dynamic table above the \
         SETTINGS_HEADER_TABLE_SIZE of {MAX_HEADER_TABLE_SIZE} bytes"
    )]
    DynamicTableTooLarge { stream: u32 },
    #[error("HPACK decoding of stream {stream}'s headers failed: {reason}")]
    Hpack { stream: u32, reason: String },
}

/// A request header block waiting for its CONTINUATION frames.
struct OpenHeaderBlock {
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; PRIORITY_LEN]>,
    fragment: Vec<u8>,
    /// CONTINUATION frames received so far without END_HEADERS.
    continuations: usize,
}

/// The client-to-server half of an HTTP/2 connection, rewritten frame by frame.
pub struct FrameRewriter {
    unparsed: Vec<u8>,
    preface_seen: bool,
    open_block: Option<OpenHeaderBlock>,
    decoder: Decoder<'static>,
    rewritten_authorities: u64,
}

impl Default for FrameRewriter {
    fn default() -> Self {
        Self::new()
    }
}

impl FrameRewriter {
    pub fn new() -> Self {
        let mut decoder = Decoder::new();
        // Without this loona_hpack accepts any size update, and the client could grow the
        // dynamic table we keep for it without bound.
        decoder.set_max_allowed_table_size(MAX_HEADER_TABLE_SIZE);
        Self {
            unparsed: Vec::new(),
            preface_seen: false,
            open_block: None,
            decoder,
            rewritten_authorities: 0,
        }
    }

    /// How many `:authority` values were replaced so far.
    pub fn rewritten_authorities(&self) -> u64 {
        self.rewritten_authorities
    }

    /// Bytes received but not yet forwarded (an incomplete frame).
    pub fn buffered(&self) -> usize {
        self.unparsed.len()
    }

    /// Consumes client bytes and appends what the server should read to `out`. Incomplete
    /// frames stay buffered until the rest arrives.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<(), RewriteError> {
        self.unparsed.extend_from_slice(input);
        let mut pos = 0;
        if !self.preface_seen {
            let seen = self.unparsed.len().min(CLIENT_PREFACE.len());
            if self.unparsed[..seen] != CLIENT_PREFACE[..seen] {
                return Err(RewriteError::Preface);
            }
            if seen < CLIENT_PREFACE.len() {
                return Ok(());
            }
            out.extend_from_slice(CLIENT_PREFACE);
            pos = CLIENT_PREFACE.len();
            self.preface_seen = true;
        }
        while let Some(frame_len) = self.complete_frame_at(pos)? {
            let frame = &self.unparsed[pos..pos + frame_len];
            let (kind, flags) = (frame[3], frame[4]);
            let stream = u32::from_be_bytes([frame[5], frame[6], frame[7], frame[8]]) & 0x7fff_ffff;
            let payload = &frame[FRAME_HEADER_LEN..];
            match (kind, self.open_block.as_mut()) {
                (FRAME_HEADERS, None) => {
                    let block = parse_headers_frame(stream, flags, payload)?;
                    if flags & FLAG_END_HEADERS != 0 {
                        let encoded = self.rewrite_block(&block)?;
                        write_header_frames(&block, &encoded, out);
                    } else {
                        self.open_block = Some(block);
                    }
                }
                (FRAME_CONTINUATION, Some(block)) if block.stream == stream => {
                    if flags & FLAG_END_HEADERS == 0 {
                        block.continuations += 1;
                        if block.continuations > MAX_CONTINUATION_FRAMES {
                            return Err(RewriteError::TooManyContinuations { stream });
                        }
                    }
                    if block.fragment.len() + payload.len() > MAX_HEADER_BLOCK {
                        return Err(RewriteError::HeaderBlockTooLarge { stream });
                    }
                    block.fragment.extend_from_slice(payload);
                    if flags & FLAG_END_HEADERS != 0
                        && let Some(block) = self.open_block.take()
                    {
                        let encoded = self.rewrite_block(&block)?;
                        write_header_frames(&block, &encoded, out);
                    }
                }
                (_, Some(block)) => {
                    // RFC 9113 §6.10: a connection error the server would raise too.
                    return Err(RewriteError::InterruptedHeaderBlock {
                        kind,
                        stream: block.stream,
                    });
                }
                _ => out.extend_from_slice(frame),
            }
            pos += frame_len;
        }
        self.unparsed.drain(..pos);
        Ok(())
    }

    /// The length of the whole frame starting at `pos`, once all of it has arrived. A frame the
    /// server would refuse is refused as soon as its header has arrived.
    fn complete_frame_at(&self, pos: usize) -> Result<Option<usize>, RewriteError> {
        let rest = &self.unparsed[pos..];
        if rest.len() < FRAME_HEADER_LEN {
            return Ok(None);
        }
        let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
        if len > MAX_FRAME_SIZE {
            return Err(RewriteError::FrameTooLarge {
                kind: rest[3],
                stream: u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]) & 0x7fff_ffff,
                len,
            });
        }
        Ok((rest.len() >= FRAME_HEADER_LEN + len).then_some(FRAME_HEADER_LEN + len))
    }

    /// Decodes the block (keeping the client's HPACK state) and re-encodes it without indexing,
    /// with a valid `:authority`.
    fn rewrite_block(&mut self, block: &OpenHeaderBlock) -> Result<Vec<u8>, RewriteError> {
        let stream = block.stream;
        let mut encoded = Vec::with_capacity(block.fragment.len().min(MAX_HEADER_LIST_SIZE) + 32);
        let mut list_size = 0usize;
        let mut rewritten = 0;
        // The callback cannot stop the decoder, which must run to the end anyway to keep the
        // client's dynamic table right; past the limit it only counts, so what we keep stays
        // under the limit (a literal re-encodes in less than its 32-byte entry overhead).
        let decoded = self.decoder.decode_with_cb(&block.fragment, |name, value| {
            let forwarded: &[u8] = if *name == *b":authority" && !is_valid_authority(&value) {
                rewritten += 1;
                tracing::debug!(
                    stream,
                    authority = %String::from_utf8_lossy(&value),
                    "replaced an :authority the gRPC server would refuse"
                );
                REPLACEMENT_AUTHORITY
            } else {
                &value
            };
            list_size =
                list_size.saturating_add(name.len() + forwarded.len() + HEADER_ENTRY_OVERHEAD);
            if list_size < MAX_HEADER_LIST_SIZE {
                encode_literal_without_indexing(&name, forwarded, &mut encoded);
            }
        });
        decoded.map_err(|error| match error {
            DecoderError::InvalidMaxDynamicSize => RewriteError::DynamicTableTooLarge { stream },
            error => RewriteError::Hpack {
                stream,
                reason: error.to_string(),
            },
        })?;
        if list_size >= MAX_HEADER_LIST_SIZE {
            return Err(RewriteError::HeaderListTooLarge {
                stream,
                size: list_size,
            });
        }
        self.rewritten_authorities += rewritten;
        Ok(encoded)
    }
}

/// The test h2 applies to a request's `:authority`.
fn is_valid_authority(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
}

fn parse_headers_frame(
    stream: u32,
    flags: u8,
    payload: &[u8],
) -> Result<OpenHeaderBlock, RewriteError> {
    let malformed = || RewriteError::MalformedHeaders { stream };
    let mut body = payload;
    if flags & FLAG_PADDED != 0 {
        let (&pad, rest) = body.split_first().ok_or_else(malformed)?;
        let keep = rest
            .len()
            .checked_sub(usize::from(pad))
            .ok_or_else(malformed)?;
        body = &rest[..keep];
    }
    let priority = if flags & FLAG_PRIORITY != 0 {
        let (fields, rest) = body
            .split_first_chunk::<PRIORITY_LEN>()
            .ok_or_else(malformed)?;
        body = rest;
        Some(*fields)
    } else {
        None
    };
    Ok(OpenHeaderBlock {
        stream,
        end_stream: flags & FLAG_END_STREAM != 0,
        priority,
        fragment: body.to_vec(),
        continuations: 0,
    })
}

/// RFC 7541 §6.2.2, new name, no Huffman coding.
fn encode_literal_without_indexing(name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    out.push(0x00);
    for string in [name, value] {
        // Writing into a Vec cannot fail.
        let _ = encode_integer_into(string.len(), 7, 0, out);
        out.extend_from_slice(string);
    }
}

/// One HEADERS frame (unpadded, END_HEADERS on the last frame) and as many CONTINUATION frames
/// as the block needs.
fn write_header_frames(block: &OpenHeaderBlock, encoded: &[u8], out: &mut Vec<u8>) {
    let priority_len = block.priority.map_or(0, |_| PRIORITY_LEN);
    let first_len = encoded.len().min(MAX_FRAME_SIZE - priority_len);
    let (first, mut rest) = encoded.split_at(first_len);
    let mut flags = if block.end_stream { FLAG_END_STREAM } else { 0 };
    if block.priority.is_some() {
        flags |= FLAG_PRIORITY;
    }
    if rest.is_empty() {
        flags |= FLAG_END_HEADERS;
    }
    write_frame_header(
        out,
        priority_len + first.len(),
        FRAME_HEADERS,
        flags,
        block.stream,
    );
    if let Some(priority) = block.priority {
        out.extend_from_slice(&priority);
    }
    out.extend_from_slice(first);
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(rest.len().min(MAX_FRAME_SIZE));
        rest = tail;
        let flags = if rest.is_empty() { FLAG_END_HEADERS } else { 0 };
        write_frame_header(out, chunk.len(), FRAME_CONTINUATION, flags, block.stream);
        out.extend_from_slice(chunk);
    }
}

fn write_frame_header(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    let len = u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes();
    out.extend_from_slice(&len[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
}

/// A connection whose client-to-server bytes go through a [`FrameRewriter`]; writes pass
/// straight through.
pub struct NormalizeAuthority<S> {
    inner: S,
    rewriter: FrameRewriter,
    read_chunk: Box<[u8]>,
    ready: Vec<u8>,
    ready_pos: usize,
    eof: bool,
    /// The rewriter refused the client's bytes: every later read fails too, without logging again.
    refused: bool,
}

impl<S> NormalizeAuthority<S> {
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            rewriter: FrameRewriter::new(),
            read_chunk: vec![0; 16 * 1024].into_boxed_slice(),
            ready: Vec::new(),
            ready_pos: 0,
            eof: false,
            refused: false,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for NormalizeAuthority<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.refused {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "registration connection already refused",
            )));
        }
        loop {
            if this.ready_pos < this.ready.len() {
                let n = buf.remaining().min(this.ready.len() - this.ready_pos);
                buf.put_slice(&this.ready[this.ready_pos..this.ready_pos + n]);
                this.ready_pos += n;
                if this.ready_pos == this.ready.len() {
                    this.ready.clear();
                    this.ready_pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            let mut chunk = ReadBuf::new(&mut this.read_chunk);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut chunk))?;
            if chunk.filled().is_empty() {
                this.eof = true;
                if this.rewriter.buffered() > 0 {
                    tracing::debug!(
                        bytes = this.rewriter.buffered(),
                        "registration client closed the connection mid-frame"
                    );
                }
                continue;
            }
            if let Err(error) = this.rewriter.feed(chunk.filled(), &mut this.ready) {
                // The one log line for this refusal: tonic reports the failed connection at
                // debug level only, and other connections and the server carry on.
                tracing::warn!(%error, "closing a registration connection: its HTTP/2 stream cannot be read");
                this.refused = true;
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, error)));
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for NormalizeAuthority<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl<S: Connected> Connected for NormalizeAuthority<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loona_hpack::Encoder;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        write_frame_header(&mut out, payload.len(), kind, flags, stream);
        out.extend_from_slice(payload);
        out
    }

    /// Splits `bytes` into frames: (kind, flags, stream, payload).
    fn frames(mut bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        let mut out = vec![];
        while !bytes.is_empty() {
            let len =
                usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
            let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]);
            out.push((bytes[3], bytes[4], stream, bytes[9..9 + len].to_vec()));
            bytes = &bytes[9 + len..];
        }
        out
    }

    fn request(authority: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/pluginregistration.Registration/GetInfo"),
            (":authority", authority),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
        .into_iter()
        .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
    }

    fn encode(encoder: &mut Encoder<'_>, headers: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
        encoder.encode(headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice())))
    }

    const WATCHER_AUTHORITY: &str =
        "%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fgpu.nvidia.com-reg.sock";

    #[test]
    fn replaces_percent_encoded_authority_and_keeps_everything_else() {
        let mut client = Encoder::new();
        let settings = frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100]);
        let data = frame(0x0, FLAG_END_STREAM, 1, b"\0\0\0\0\0");
        let mut input = CLIENT_PREFACE.to_vec();
        input.extend(&settings);
        input.extend(frame(
            FRAME_HEADERS,
            FLAG_END_HEADERS,
            1,
            &encode(&mut client, &request(WATCHER_AUTHORITY)),
        ));
        input.extend(&data);
        // A second request reuses the client's dynamic table entries.
        input.extend(frame(
            FRAME_HEADERS,
            FLAG_END_HEADERS,
            3,
            &encode(&mut client, &request(WATCHER_AUTHORITY)),
        ));

        let mut rewriter = FrameRewriter::new();
        let mut out = Vec::new();
        // Byte by byte: frames split across reads must come out whole.
        for byte in &input {
            rewriter.feed(std::slice::from_ref(byte), &mut out).unwrap();
        }
        assert_eq!(rewriter.buffered(), 0);
        assert_eq!(rewriter.rewritten_authorities(), 2);
        assert_eq!(&out[..CLIENT_PREFACE.len()], CLIENT_PREFACE);
        let got = frames(&out[CLIENT_PREFACE.len()..]);
        assert_eq!(got.len(), 4);
        assert_eq!(frame(got[0].0, got[0].1, got[0].2, &got[0].3), settings);
        assert_eq!(frame(got[2].0, got[2].1, got[2].2, &got[2].3), data);
        let mut server = Decoder::new();
        for (index, stream) in [(1, 1), (3, 3)] {
            let (kind, flags, id, payload) = &got[index];
            assert_eq!(
                (*kind, *flags, *id),
                (FRAME_HEADERS, FLAG_END_HEADERS, stream)
            );
            assert_eq!(server.decode(payload).unwrap(), request("localhost"));
        }
    }

    #[test]
    fn valid_authorities_pass_unchanged_and_continuations_are_joined() {
        let mut client = Encoder::new();
        let mut headers = request("localhost");
        headers.push((b"x-big".to_vec(), vec![b'a'; 15_000]));
        let block = encode(&mut client, &headers);
        let (a, rest) = block.split_at(10);
        let (b, c) = rest.split_at(8_000);
        let mut input = CLIENT_PREFACE.to_vec();
        // Padded, with priority, END_STREAM, split over two CONTINUATIONs.
        let mut payload = vec![3u8];
        payload.extend([0, 0, 0, 0, 16]);
        payload.extend(a);
        payload.extend([0, 0, 0]);
        input.extend(frame(
            FRAME_HEADERS,
            FLAG_PADDED | FLAG_PRIORITY | FLAG_END_STREAM,
            5,
            &payload,
        ));
        input.extend(frame(FRAME_CONTINUATION, 0, 5, b));
        input.extend(frame(FRAME_CONTINUATION, FLAG_END_HEADERS, 5, c));

        let mut rewriter = FrameRewriter::new();
        let mut out = Vec::new();
        rewriter.feed(&input, &mut out).unwrap();
        assert_eq!(rewriter.rewritten_authorities(), 0);
        let got = frames(&out[CLIENT_PREFACE.len()..]);
        // A list under the server's limit always re-encodes into one frame.
        assert_eq!(got.len(), 1);
        let (kind, flags, stream, payload) = &got[0];
        assert_eq!((*kind, *stream), (FRAME_HEADERS, 5));
        assert_eq!(*flags, FLAG_PRIORITY | FLAG_END_STREAM | FLAG_END_HEADERS);
        assert_eq!(&payload[..5], &[0, 0, 0, 0, 16]);
        assert_eq!(Decoder::new().decode(&payload[5..]).unwrap(), headers);
    }

    #[test]
    fn blocks_larger_than_a_frame_are_written_as_continuations() {
        let block = OpenHeaderBlock {
            stream: 5,
            end_stream: true,
            priority: Some([0, 0, 0, 0, 16]),
            fragment: Vec::new(),
            continuations: 0,
        };
        let encoded: Vec<u8> = (0..40_000u32).map(|i| i as u8).collect();
        let mut out = Vec::new();
        write_header_frames(&block, &encoded, &mut out);
        let got = frames(&out);
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].0, FRAME_HEADERS);
        assert_eq!(got[0].1, FLAG_PRIORITY | FLAG_END_STREAM);
        assert_eq!(&got[0].3[..5], &[0, 0, 0, 0, 16]);
        let mut joined = got[0].3[5..].to_vec();
        for (i, (kind, flags, stream, payload)) in got.iter().enumerate() {
            assert!(payload.len() <= MAX_FRAME_SIZE);
            if i == 0 {
                continue;
            }
            assert_eq!((*kind, *stream), (FRAME_CONTINUATION, 5));
            let last = i == got.len() - 1;
            assert_eq!(*flags, if last { FLAG_END_HEADERS } else { 0 });
            joined.extend(payload);
        }
        assert_eq!(joined, encoded);
    }

    /// A client's header block as HEADERS and CONTINUATION frames of at most the frame limit.
    fn header_frames(stream: u32, block: &[u8]) -> Vec<u8> {
        let open = OpenHeaderBlock {
            stream,
            end_stream: true,
            priority: None,
            fragment: Vec::new(),
            continuations: 0,
        };
        let mut out = Vec::new();
        write_header_frames(&open, block, &mut out);
        out
    }

    fn feed_all(input: &[u8]) -> (FrameRewriter, Result<Vec<u8>, RewriteError>) {
        let mut rewriter = FrameRewriter::new();
        let mut out = Vec::new();
        rewriter.feed(CLIENT_PREFACE, &mut out).unwrap();
        let result = rewriter.feed(input, &mut out).map(|()| out);
        (rewriter, result)
    }

    /// RFC 9113 §6.5.2's size of a header list.
    fn list_size(headers: &[(Vec<u8>, Vec<u8>)]) -> usize {
        headers.iter().map(|(n, v)| n.len() + v.len() + 32).sum()
    }

    #[test]
    fn header_list_of_many_headers_over_the_limit_is_refused() {
        let mut headers = request("localhost");
        for i in 0..200 {
            headers.push((format!("x-h-{i:03}").into_bytes(), vec![b'v'; 50]));
        }
        assert!(list_size(&headers) > MAX_HEADER_LIST_SIZE);
        let block = encode(&mut Encoder::new(), &headers);
        let (_, result) = feed_all(&header_frames(7, &block));
        let expected = list_size(&headers);
        assert!(
            matches!(
                result,
                Err(RewriteError::HeaderListTooLarge { stream: 7, size }) if size == expected
            ),
            "{result:?}"
        );
    }

    #[test]
    fn header_list_with_one_huge_value_is_refused() {
        let mut headers = request("localhost");
        headers.push((b"x-huge".to_vec(), vec![b'v'; 40_000]));
        let block = encode(&mut Encoder::new(), &headers);
        assert!(block.len() <= MAX_HEADER_BLOCK);
        let (_, result) = feed_all(&header_frames(9, &block));
        assert!(
            matches!(
                result,
                Err(RewriteError::HeaderListTooLarge { stream: 9, .. })
            ),
            "{result:?}"
        );
    }

    #[test]
    fn header_list_limit_is_where_the_server_puts_it() {
        // h2 answers 431 once the list reaches the limit, so one byte less is the largest that
        // passes; the list is counted as forwarded, with the replaced authority.
        for (padding, accepted) in [
            (MAX_HEADER_LIST_SIZE - 1, true),
            (MAX_HEADER_LIST_SIZE, false),
        ] {
            let forwarded = request("localhost");
            let name = b"x-pad".to_vec();
            let value_len = padding - list_size(&forwarded) - name.len() - 32;
            let mut sent = request(WATCHER_AUTHORITY);
            sent.push((name.clone(), vec![b'p'; value_len]));
            let block = encode(&mut Encoder::new(), &sent);
            let (rewriter, result) = feed_all(&header_frames(1, &block));
            if accepted {
                let out = result.unwrap();
                assert_eq!(rewriter.rewritten_authorities(), 1);
                let got = frames(&out[CLIENT_PREFACE.len()..]);
                let mut expected = forwarded;
                expected.push((name, vec![b'p'; value_len]));
                assert_eq!(list_size(&expected), padding);
                assert_eq!(Decoder::new().decode(&got[0].3).unwrap(), expected);
            } else {
                assert!(
                    matches!(
                        result,
                        Err(RewriteError::HeaderListTooLarge { stream: 1, size }) if size == padding
                    ),
                    "{result:?}"
                );
            }
        }
    }

    /// A dynamic table size update (RFC 7541 §6.3) followed by an indexed `:method: GET`.
    fn size_update_block(size: usize) -> Vec<u8> {
        let mut block = Vec::new();
        encode_integer_into(size, 5, 0x20, &mut block).unwrap();
        block.push(0x82);
        block
    }

    #[test]
    fn dynamic_table_size_update_above_the_advertised_size_is_refused() {
        let (_, result) = feed_all(&frame(
            FRAME_HEADERS,
            FLAG_END_HEADERS,
            3,
            &size_update_block(MAX_HEADER_TABLE_SIZE + 1),
        ));
        assert!(
            matches!(
                result,
                Err(RewriteError::DynamicTableTooLarge { stream: 3 })
            ),
            "{result:?}"
        );

        // Shrinking and growing back to the advertised size is the client's right.
        let mut input = frame(FRAME_HEADERS, FLAG_END_HEADERS, 1, &size_update_block(0));
        input.extend(frame(
            FRAME_HEADERS,
            FLAG_END_HEADERS,
            3,
            &size_update_block(MAX_HEADER_TABLE_SIZE),
        ));
        let (_, result) = feed_all(&input);
        let out = result.unwrap();
        let got = frames(&out[CLIENT_PREFACE.len()..]);
        assert_eq!(got.len(), 2);
        let mut server = Decoder::new();
        for (_, _, _, payload) in &got {
            assert_eq!(
                server.decode(payload).unwrap(),
                vec![(b":method".to_vec(), b"GET".to_vec())]
            );
        }
    }

    #[test]
    fn frame_over_the_frame_limit_is_refused_from_its_header() {
        // The largest frame passes through whole.
        let data = frame(0x0, 0, 1, &vec![0; MAX_FRAME_SIZE]);
        let (_, result) = feed_all(&data);
        assert_eq!(&result.unwrap()[CLIENT_PREFACE.len()..], &data[..]);

        let mut rewriter = FrameRewriter::new();
        let mut out = Vec::new();
        rewriter.feed(CLIENT_PREFACE, &mut out).unwrap();
        assert_eq!(rewriter.buffered(), 0);
        let oversize = MAX_FRAME_SIZE + 1;
        let mut header = Vec::new();
        write_frame_header(&mut header, oversize, 0x0, 0, 1);
        let result = rewriter.feed(&header, &mut out);
        assert!(
            matches!(
                result,
                Err(RewriteError::FrameTooLarge { kind: 0, stream: 1, len }) if len == oversize
            ),
            "{result:?}"
        );
        assert_eq!(
            rewriter.buffered(),
            FRAME_HEADER_LEN,
            "no payload was awaited"
        );
    }

    #[test]
    fn continuation_flood_past_the_block_limit_is_refused() {
        let fragment = vec![0x82; MAX_FRAME_SIZE];
        let mut rewriter = FrameRewriter::new();
        let mut out = Vec::new();
        rewriter.feed(CLIENT_PREFACE, &mut out).unwrap();
        rewriter
            .feed(&frame(FRAME_HEADERS, 0, 1, &fragment), &mut out)
            .unwrap();
        let mut received = MAX_FRAME_SIZE;
        let error = loop {
            match rewriter.feed(&frame(FRAME_CONTINUATION, 0, 1, &fragment), &mut out) {
                Ok(()) => received += MAX_FRAME_SIZE,
                Err(error) => break error,
            }
            assert!(
                received <= MAX_HEADER_BLOCK,
                "flood was buffered past the limit"
            );
        };
        assert!(
            matches!(error, RewriteError::HeaderBlockTooLarge { stream: 1 }),
            "{error:?}"
        );
        assert_eq!(received, MAX_HEADER_BLOCK);
        assert_eq!(out, CLIENT_PREFACE, "nothing of the block was forwarded");
    }

    #[test]
    fn flood_of_empty_continuations_is_refused_where_h2_refuses_it() {
        assert_eq!(MAX_CONTINUATION_FRAMES, 5);
        let block = encode(&mut Encoder::new(), &request("localhost"));
        let (head, tail) = block.split_at(4);
        // As many empty CONTINUATIONs as h2 tolerates, then the end of the block: passes.
        let mut input = frame(FRAME_HEADERS, 0, 1, head);
        for _ in 0..MAX_CONTINUATION_FRAMES {
            input.extend(frame(FRAME_CONTINUATION, 0, 1, &[]));
        }
        input.extend(frame(FRAME_CONTINUATION, FLAG_END_HEADERS, 1, tail));
        let (_, result) = feed_all(&input);
        let out = result.unwrap();
        let got = frames(&out[CLIENT_PREFACE.len()..]);
        assert_eq!(
            Decoder::new().decode(&got[0].3).unwrap(),
            request("localhost")
        );

        // One more is refused.
        let mut input = frame(FRAME_HEADERS, 0, 1, head);
        for _ in 0..=MAX_CONTINUATION_FRAMES {
            input.extend(frame(FRAME_CONTINUATION, 0, 1, &[]));
        }
        let (_, result) = feed_all(&input);
        assert!(
            matches!(
                result,
                Err(RewriteError::TooManyContinuations { stream: 1 })
            ),
            "{result:?}"
        );
    }

    #[tokio::test]
    async fn refusing_one_connection_leaves_the_others_and_the_server_serving() {
        use std::time::Duration;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        use tokio_stream::StreamExt;
        use tonic::transport::{Channel, Endpoint, Server};
        use tonic_health::pb::health_check_response::ServingStatus;
        use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("reg.sock");
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(
            tokio::net::UnixListener::bind(&path).unwrap(),
        )
        .map(|accepted| accepted.map(NormalizeAuthority::new));
        let (_reporter, health) = tonic_health::server::health_reporter();
        let server = tokio::spawn(
            Server::builder()
                .add_service(health)
                .serve_with_incoming(incoming),
        );
        let serving = |channel: Channel| async move {
            let request = HealthCheckRequest {
                service: String::new(),
            };
            let response = HealthClient::new(channel).check(request).await.unwrap();
            response.into_inner().status == ServingStatus::Serving as i32
        };
        let endpoint = Endpoint::from_shared(format!("unix:{}", path.display())).unwrap();
        let open_before = endpoint.connect().await.unwrap();
        assert!(serving(open_before.clone()).await);

        let mut refused = tokio::net::UnixStream::connect(&path).await.unwrap();
        let mut oversize = CLIENT_PREFACE.to_vec();
        write_frame_header(&mut oversize, MAX_FRAME_SIZE + 1, 0x0, 0, 1);
        refused.write_all(&oversize).await.unwrap();
        // The server closes it (after its own SETTINGS, perhaps with a reset): reads end.
        let mut sink = Vec::new();
        let closed =
            tokio::time::timeout(Duration::from_secs(10), refused.read_to_end(&mut sink)).await;
        assert!(closed.is_ok(), "the refused connection stayed open");

        assert!(serving(open_before).await, "the open connection broke");
        assert!(
            serving(endpoint.connect().await.unwrap()).await,
            "no new connection"
        );
        assert!(!server.is_finished(), "the server stopped");
    }

    #[test]
    fn malformed_input_is_refused() {
        let mut out = Vec::new();
        assert!(matches!(
            FrameRewriter::new().feed(b"GET / HTTP/1.1\r\n", &mut out),
            Err(RewriteError::Preface)
        ));

        let mut input = CLIENT_PREFACE.to_vec();
        input.extend(frame(FRAME_HEADERS, 0, 1, &[0x82]));
        input.extend(frame(0x0, 0, 1, b"x"));
        assert!(matches!(
            FrameRewriter::new().feed(&input, &mut out),
            Err(RewriteError::InterruptedHeaderBlock { kind: 0, stream: 1 })
        ));

        let mut input = CLIENT_PREFACE.to_vec();
        input.extend(frame(
            FRAME_HEADERS,
            FLAG_END_HEADERS | FLAG_PADDED,
            1,
            &[9, 0x82],
        ));
        assert!(matches!(
            FrameRewriter::new().feed(&input, &mut out),
            Err(RewriteError::MalformedHeaders { stream: 1 })
        ));

        let mut input = CLIENT_PREFACE.to_vec();
        // Index 99 is in neither table.
        input.extend(frame(FRAME_HEADERS, FLAG_END_HEADERS, 1, &[0xff, 0x24]));
        assert!(matches!(
            FrameRewriter::new().feed(&input, &mut out),
            Err(RewriteError::Hpack { stream: 1, .. })
        ));
    }
}
