//! The non-generative endpoints' answers: deterministic embedding vectors and rerank scores. Pure.
//!
//! Embeddings are a function of the input text only (FNV-1a seed, splitmix64 stream, unit length),
//! so equal inputs get equal vectors across runs and processes. Rerank scores are the share of the
//! query's words found in the document, which orders documents sensibly in tests.

/// FNV-1a, 64-bit: a stable, dependency-free hash (std's hasher is randomly seeded per process).
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// splitmix64 step: turns the seed into a stream of well-mixed values.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut mixed = *state;
    mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    mixed ^ (mixed >> 31)
}

/// A unit-length vector of `dimension` components derived from `text`.
pub fn embedding(text: &str, dimension: usize) -> Vec<f32> {
    let mut state = fnv1a(text.as_bytes());
    let mut vector: Vec<f32> = (0..dimension)
        .map(|_| {
            // Top 24 bits -> [0, 1) -> [-1, 1).
            let unit = (splitmix64(&mut state) >> 40) as f32 / (1u64 << 24) as f32;
            unit * 2.0 - 1.0
        })
        .collect();
    let norm = vector.iter().map(|value| value * value).sum::<f32>().sqrt();
    if norm > 0.0 {
        for value in &mut vector {
            *value /= norm;
        }
    }
    vector
}

fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|word| !word.is_empty())
        .map(str::to_lowercase)
}

/// Share of the query's distinct words that appear in the document, in `[0, 1]`.
pub fn relevance_score(query: &str, document: &str) -> f64 {
    let mut query_words: Vec<String> = words(query).collect();
    query_words.sort_unstable();
    query_words.dedup();
    if query_words.is_empty() {
        return 0.0;
    }
    let document_words: Vec<String> = words(document).collect();
    let shared = query_words
        .iter()
        .filter(|word| document_words.contains(word))
        .count();
    shared as f64 / query_words.len() as f64
}

/// `(document index, score)` sorted by score, best first; ties keep document order. At most
/// `top_n` results when given.
pub fn rerank(query: &str, documents: &[&str], top_n: Option<usize>) -> Vec<(usize, f64)> {
    let mut results: Vec<(usize, f64)> = documents
        .iter()
        .enumerate()
        .map(|(index, document)| (index, relevance_score(query, document)))
        .collect();
    // Stable sort: equal scores stay in input order.
    results.sort_by(|left, right| right.1.total_cmp(&left.1));
    if let Some(top_n) = top_n {
        results.truncate(top_n);
    }
    results
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embeddings_are_deterministic_unit_vectors() {
        let first = embedding("hello", 8);
        assert_eq!(first, embedding("hello", 8));
        assert_ne!(first, embedding("world", 8));
        let norm: f32 = first.iter().map(|value| value * value).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5);
        assert!(embedding("x", 0).is_empty());
    }

    #[test]
    fn relevance_is_shared_word_ratio() {
        assert_eq!(relevance_score("red fox", "The red FOX jumps"), 1.0);
        assert_eq!(relevance_score("red fox", "a red car"), 0.5);
        assert_eq!(relevance_score("red fox", "nothing"), 0.0);
        assert_eq!(relevance_score("", "anything"), 0.0);
    }

    #[test]
    fn rerank_sorts_best_first_and_truncates() {
        let documents = ["blue", "red fox", "red", "fox"];
        assert_eq!(
            rerank("red fox", &documents, None),
            vec![(1, 1.0), (2, 0.5), (3, 0.5), (0, 0.0)]
        );
        assert_eq!(rerank("red fox", &documents, Some(1)), vec![(1, 1.0)]);
        assert!(rerank("q", &[], Some(3)).is_empty());
    }
}
