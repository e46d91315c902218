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

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use loona_hpack::{Decoder, encoder::encode_integer_into};
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
/// SETTINGS_MAX_FRAME_SIZE's initial value: the server cannot have advertised less.
const MAX_OUTGOING_FRAME: usize = 16_384;
/// The largest frame we buffer; HTTP/2 allows at most 2^24-1 and h2 accepts 16 KiB by default.
const MAX_INCOMING_FRAME: usize = 1 << 24;
/// A header block larger than this is refused rather than buffered (h2's default limit is 16 KiB
/// of decoded headers; gRPC requests carry a few hundred bytes).
const MAX_HEADER_BLOCK: usize = 1 << 20;

/// Why a client's byte stream could not be rewritten; the connection is closed.
#[derive(Debug, thiserror::Error)]
pub enum RewriteError {
    #[error("the client did not start with the HTTP/2 connection preface")]
    Preface,
    #[error("frame of {len} bytes is larger than HTTP/2 allows")]
    FrameTooLarge { len: usize },
    #[error("HEADERS frame on stream {stream} has invalid padding or priority fields")]
    MalformedHeaders { stream: u32 },
    #[error("a {kind:#x} frame interrupted the header block of stream {stream}")]
    InterruptedHeaderBlock { kind: u8, stream: u32 },
    #[error("header block of stream {stream} is larger than {MAX_HEADER_BLOCK} bytes")]
    HeaderBlockTooLarge { stream: u32 },
    #[error("HPACK decoding of stream {stream}'s headers failed: {reason}")]
    Hpack { stream: u32, reason: String },
}

/// A request header block waiting for its CONTINUATION frames.
struct OpenHeaderBlock {
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; PRIORITY_LEN]>,
    fragment: Vec<u8>,
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
        Self {
            unparsed: Vec::new(),
            preface_seen: false,
            open_block: None,
            decoder: Decoder::new(),
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

    /// The length of the whole frame starting at `pos`, once all of it has arrived.
    fn complete_frame_at(&self, pos: usize) -> Result<Option<usize>, RewriteError> {
        let rest = &self.unparsed[pos..];
        if rest.len() < FRAME_HEADER_LEN {
            return Ok(None);
        }
        let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
        if len >= MAX_INCOMING_FRAME {
            return Err(RewriteError::FrameTooLarge { len });
        }
        Ok((rest.len() >= FRAME_HEADER_LEN + len).then_some(FRAME_HEADER_LEN + len))
    }

    /// Decodes the block (keeping the client's HPACK state) and re-encodes it without indexing,
    /// with a valid `:authority`.
    fn rewrite_block(&mut self, block: &OpenHeaderBlock) -> Result<Vec<u8>, RewriteError> {
        let headers =
            self.decoder
                .decode(&block.fragment)
                .map_err(|error| RewriteError::Hpack {
                    stream: block.stream,
                    reason: format!("{error:?}"),
                })?;
        let mut encoded = Vec::with_capacity(block.fragment.len() + 32);
        for (name, value) in &headers {
            let value = if name == b":authority" && !is_valid_authority(value) {
                self.rewritten_authorities += 1;
                tracing::debug!(
                    stream = block.stream,
                    authority = %String::from_utf8_lossy(value),
                    "replaced an :authority the gRPC server would refuse"
                );
                REPLACEMENT_AUTHORITY
            } else {
                value.as_slice()
            };
            encode_literal_without_indexing(name, value, &mut encoded);
        }
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
    let first_len = encoded.len().min(MAX_OUTGOING_FRAME - priority_len);
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
        let (chunk, tail) = rest.split_at(rest.len().min(MAX_OUTGOING_FRAME));
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
                tracing::warn!(%error, "closing a registration connection: its HTTP/2 stream cannot be read");
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
        headers.push((b"x-big".to_vec(), vec![b'a'; 40_000]));
        let block = encode(&mut client, &headers);
        let (a, rest) = block.split_at(10);
        let (b, c) = rest.split_at(20_000);
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
        assert!(got.len() >= 3, "40 KB of headers need continuation frames");
        assert_eq!(got[0].0, FRAME_HEADERS);
        assert_eq!(got[0].1, FLAG_PRIORITY | FLAG_END_STREAM);
        assert_eq!(&got[0].3[..5], &[0, 0, 0, 0, 16]);
        let mut joined = got[0].3[5..].to_vec();
        for (i, (kind, flags, stream, payload)) in got.iter().enumerate().skip(1) {
            assert_eq!((*kind, *stream), (FRAME_CONTINUATION, 5));
            let last = i == got.len() - 1;
            assert_eq!(*flags, if last { FLAG_END_HEADERS } else { 0 });
            assert!(payload.len() <= MAX_OUTGOING_FRAME);
            joined.extend(payload);
        }
        assert_eq!(Decoder::new().decode(&joined).unwrap(), headers);
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
