//! SCRAM's channel binding over TLS (`tls-server-end-point`, RFC 5929 §4.1): the hash of the
//! server's certificate, by the hash of the certificate's own signature algorithm (SHA-256 for
//! MD5 and SHA-1), as PostgreSQL computes it on its side. With it a login by password proves
//! that no one in between ended the TLS session (`channel_binding=require`, which connection
//! strings of hosted PostgreSQL services carry).

use ring::digest;

/// The binding data for the certificate `der`; `None` for other signature algorithms: RSA-PSS
/// (whose hash is in the algorithm's parameters, and which a server built on an older OpenSSL
/// refuses to bind) and Ed25519 (which the RFC leaves without a hash, and whose binding the
/// server cannot compute). `None` logs in without binding (`channel_binding=prefer`, the
/// default); `channel_binding=require` then fails with "server did not use channel binding".
pub(crate) fn server_end_point(der: &[u8]) -> Option<Vec<u8>> {
    let algorithm = hash_of(signature_algorithm(der)?)?;
    Some(digest::digest(algorithm, der).as_ref().to_vec())
}

/// The signature algorithms' object identifiers (DER contents), and the hash each binds with.
/// SHA-224 signatures are left out: this side has no SHA-224, so they go without a binding.
const HASHES: [(&[u8], &digest::Algorithm); 9] = [
    // md5WithRSAEncryption, sha1WithRSAEncryption: SHA-256, as the RFC says.
    (&[42, 134, 72, 134, 247, 13, 1, 1, 4], &digest::SHA256),
    (&[42, 134, 72, 134, 247, 13, 1, 1, 5], &digest::SHA256),
    // sha256, sha384 and sha512WithRSAEncryption.
    (&[42, 134, 72, 134, 247, 13, 1, 1, 11], &digest::SHA256),
    (&[42, 134, 72, 134, 247, 13, 1, 1, 12], &digest::SHA384),
    (&[42, 134, 72, 134, 247, 13, 1, 1, 13], &digest::SHA512),
    // ecdsa-with-SHA1, -SHA256, -SHA384, -SHA512.
    (&[42, 134, 72, 206, 61, 4, 1], &digest::SHA256),
    (&[42, 134, 72, 206, 61, 4, 3, 2], &digest::SHA256),
    (&[42, 134, 72, 206, 61, 4, 3, 3], &digest::SHA384),
    (&[42, 134, 72, 206, 61, 4, 3, 4], &digest::SHA512),
];

fn hash_of(oid: &[u8]) -> Option<&'static digest::Algorithm> {
    HASHES
        .iter()
        .find(|(id, _)| *id == oid)
        .map(|(_, hash)| *hash)
}

/// The object identifier of a certificate's `signatureAlgorithm`: `Certificate ::= SEQUENCE {
/// tbsCertificate, signatureAlgorithm SEQUENCE { algorithm OID, … }, signatureValue }`.
fn signature_algorithm(der: &[u8]) -> Option<&[u8]> {
    let (certificate, _) = element(der, SEQUENCE)?;
    let (_, after_tbs) = element(certificate, SEQUENCE)?;
    let (algorithm, _) = element(after_tbs, SEQUENCE)?;
    Some(element(algorithm, OID)?.0)
}

const SEQUENCE: u8 = 0x30;
const OID: u8 = 0x06;

/// The contents of the DER element at the start of `der` if its tag is `tag`, and what follows
/// it.
fn element(der: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&first, rest) = der.split_first()?;
    if first != tag {
        return None;
    }
    let (&length, rest) = rest.split_first()?;
    let (length, rest) = match length {
        0..=0x7f => (usize::from(length), rest),
        0x81..=0x84 => {
            let (bytes, rest) = rest.split_at_checked(usize::from(length - 0x80))?;
            let length = bytes.iter().fold(0usize, |n, &b| (n << 8) | usize::from(b));
            (length, rest)
        }
        _ => return None,
    };
    let (contents, after) = rest.split_at_checked(length)?;
    Some((contents, after))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A certificate's outline: its tbsCertificate (`tbs` bytes of contents), the algorithm
    /// `oid`, an empty signature.
    fn certificate(tbs: usize, oid: &[u8]) -> Vec<u8> {
        let wrap = |tag: u8, contents: &[u8]| {
            let mut out = vec![tag];
            match contents.len() {
                n if n < 0x80 => out.push(n as u8),
                n if n < 0x100 => out.extend([0x81, n as u8]),
                n => out.extend([0x82, (n >> 8) as u8, n as u8]),
            }
            out.extend_from_slice(contents);
            out
        };
        let mut body = wrap(SEQUENCE, &vec![1; tbs]);
        body.extend(wrap(SEQUENCE, &wrap(OID, oid)));
        body.extend(wrap(0x03, &[0]));
        wrap(SEQUENCE, &body)
    }

    #[test]
    fn the_hash_follows_the_signature_algorithm() {
        for tbs in [10, 200, 1000] {
            let sha384 = certificate(tbs, &[42, 134, 72, 206, 61, 4, 3, 3]);
            let expected = digest::digest(&digest::SHA384, &sha384);
            assert_eq!(server_end_point(&sha384).unwrap(), expected.as_ref());
            let sha1 = certificate(tbs, &[42, 134, 72, 134, 247, 13, 1, 1, 5]);
            assert_eq!(
                server_end_point(&sha1).unwrap().len(),
                32,
                "SHA-1 binds with SHA-256"
            );
        }
        let rsa512 = certificate(50, &[42, 134, 72, 134, 247, 13, 1, 1, 13]);
        assert_eq!(server_end_point(&rsa512).unwrap().len(), 64);
    }

    #[test]
    fn no_binding_for_other_algorithms_or_bad_der() {
        let ed25519 = certificate(50, &[43, 101, 112]);
        assert_eq!(server_end_point(&ed25519), None);
        let sha224 = certificate(50, &[42, 134, 72, 134, 247, 13, 1, 1, 14]);
        assert_eq!(server_end_point(&sha224), None);
        let whole = certificate(300, &[42, 134, 72, 206, 61, 4, 3, 2]);
        for cut in [0, 1, 3, 200, whole.len() - 5] {
            assert_eq!(server_end_point(&whole[..cut]), None, "cut at {cut}");
        }
        assert_eq!(server_end_point(&[0x30, 0x85, 1, 1, 1, 1, 1]), None);
    }
}
