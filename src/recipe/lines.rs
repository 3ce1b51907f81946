//! Where each key of a recipe is: the line a one-line error points at.
use std::collections::HashMap;

/// Line numbers (1-based) of every key and sequence item in a YAML document, by dotted path; and the
/// paths a command-line argument overrides, which errors blame on the argument instead.
pub struct LineMap(HashMap<String, usize>, HashMap<String, String>);

impl LineMap {
    pub fn build(text: &str) -> Result<Self, (usize, String)> {
        use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
        use yaml_rust2::scanner::Marker;
        enum Frame {
            Map { prefix: String, key: Option<String> },
            Seq { prefix: String, index: usize },
        }
        struct Recv {
            stack: Vec<Frame>,
            lines: HashMap<String, usize>,
        }
        fn join(prefix: &str, part: &str) -> String {
            if prefix.is_empty() {
                part.to_string()
            } else {
                format!("{prefix}.{part}")
            }
        }
        impl Recv {
            /// The path of the node that starts now, and advance the parent's state past it.
            fn node_path(&mut self, line: usize, is_scalar_key_candidate: Option<&str>) -> Option<String> {
                match self.stack.last_mut() {
                    None => Some(String::new()),
                    Some(Frame::Map { prefix, key }) => match key.take() {
                        None => {
                            if let Some(k) = is_scalar_key_candidate {
                                let path = join(prefix, k);
                                self.lines.entry(path).or_insert(line);
                                *key = Some(k.to_string());
                            }
                            None
                        }
                        Some(k) => Some(join(prefix, &k)),
                    },
                    Some(Frame::Seq { prefix, index }) => {
                        let path = join(prefix, &index.to_string());
                        *index += 1;
                        self.lines.entry(path.clone()).or_insert(line);
                        Some(path)
                    }
                }
            }
        }
        impl MarkedEventReceiver for Recv {
            fn on_event(&mut self, ev: Event, mark: Marker) {
                let line = mark.line();
                match ev {
                    Event::Scalar(s, ..) => {
                        let _ = self.node_path(line, Some(&s));
                    }
                    Event::Alias(_) => {
                        let _ = self.node_path(line, Some(""));
                    }
                    Event::MappingStart(..) => {
                        let prefix = self.node_path(line, None).unwrap_or_default();
                        self.stack.push(Frame::Map { prefix, key: None });
                    }
                    Event::SequenceStart(..) => {
                        let prefix = self.node_path(line, None).unwrap_or_default();
                        self.stack.push(Frame::Seq { prefix, index: 0 });
                    }
                    Event::MappingEnd | Event::SequenceEnd => {
                        self.stack.pop();
                    }
                    _ => {}
                }
            }
        }
        let mut recv = Recv { stack: Vec::new(), lines: HashMap::new() };
        Parser::new_from_str(text).load(&mut recv, false).map_err(|e| (e.marker().line(), e.info().to_string()))?;
        Ok(LineMap(recv.lines, HashMap::new()))
    }

    /// Blames `path` and everything below it on `argument`.
    pub fn blame_argument(&mut self, path: &str, argument: &str) {
        self.1.insert(path.to_string(), argument.to_string());
    }

    /// The argument that set `path` or an enclosing key, if one did.
    pub fn argument(&self, path: &str) -> Option<&str> {
        let mut p = path;
        loop {
            if let Some(a) = self.1.get(p) {
                return Some(a);
            }
            p = &p[..p.rfind('.')?];
        }
    }

    pub fn has(&self, path: &str) -> bool {
        self.0.contains_key(path)
    }

    /// The line of `path`, else of its nearest enclosing key that is in the file, else 1.
    pub fn line(&self, path: &str) -> usize {
        let mut p = path;
        loop {
            if let Some(&l) = self.0.get(p) {
                return l;
            }
            match p.rfind('.') {
                Some(i) => p = &p[..i],
                None => return 1,
            }
        }
    }
}
