"""The chat prompts `radixlm train-eagle` has the target answer when no --prompts file is given:
instruction templates crossed with subjects (written for this package; deterministic order), so a
head sees the kinds of answers a chat model gives (explanations, lists, code, letters, stories,
rewrites) on many topics. The answers, which the head learns from, are the target's own."""

from __future__ import annotations

import random

TEMPLATES = (
    "Explain {s} to a ten-year-old.",
    "What is {s}? Answer in three sentences.",
    "Give me five interesting facts about {s}.",
    "Write a short poem about {s}.",
    "List the pros and cons of {s}.",
    "Write a short story that involves {s}.",
    "How would you teach a beginner about {s}? Give a step-by-step plan.",
    "Summarize the history of {s} in one paragraph.",
    "What are common misconceptions about {s}?",
    "Write an email to a friend recommending they learn about {s}.",
    "Compare {s} with something similar and explain the differences.",
    "Describe {s} in exactly four bullet points.",
    "What questions would an expert ask about {s}?",
    "Write a haiku about {s}.",
    "Give a one-sentence definition of {s}, then an example.",
    "Why does {s} matter in everyday life?",
    "Write a dialogue between a teacher and a student about {s}.",
    "What would the world look like without {s}?",
    "Create a quiz with three questions about {s} and give the answers.",
    "Write a product description for a book about {s}.",
)

SUBJECTS = (
    "photosynthesis", "the water cycle", "volcanoes", "black holes", "the human heart", "electricity",
    "the Roman Empire", "the printing press", "democracy", "inflation", "compound interest", "recycling",
    "climate change", "honeybees", "the moon landing", "machine learning", "the internet", "prime numbers",
    "the Pythagorean theorem", "gravity", "vaccines", "sleep", "coffee", "chess", "the violin", "jazz music",
    "the Olympic Games", "rainforests", "deserts", "the ocean tides", "earthquakes", "dinosaurs", "bread baking",
    "gardening", "bicycles", "electric cars", "solar panels", "the stock market", "libraries", "friendship",
    "time management", "public speaking", "meditation", "the French Revolution", "ancient Egypt", "glaciers",
    "the immune system", "DNA", "the periodic table", "rainbows", "clouds", "penguins", "elephants",
    "programming in Python", "sorting algorithms", "binary numbers", "encryption", "databases", "robots",
    "the Great Wall of China", "the Amazon river", "mountains", "trains", "airplanes", "the solar system",
    "Mars", "tea", "chocolate", "soccer", "painting", "photography", "languages", "writing a resume",
    "job interviews", "healthy eating", "exercise", "cities", "bridges", "maps", "the weather", "batteries",
)

SYSTEM_FREE = (  # single prompts of other shapes: code, rewriting, arithmetic, planning
    "Write a Python function that checks whether a string is a palindrome, with a docstring.",
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Write a JavaScript function that removes duplicates from an array.",
    "Write a SQL query that lists the ten customers with the most orders.",
    "Explain what this code does: for i in range(10): print(i * i)",
    "Rewrite this sentence to sound more formal: 'hey, can you send me the file asap?'",
    "Translate 'Where is the train station?' into French, Spanish and German.",
    "What is 17 times 23? Show your work.",
    "Plan a three-day trip to Rome with a budget.",
    "Give me a weekly meal plan for a vegetarian.",
    "Write a limerick about a cat who loves boxes.",
    "Suggest five names for a new coffee shop and explain each.",
    "How do I make a good first impression at a new job?",
    "What are the steps to change a flat tire?",
    "Write a thank-you note to a teacher.",
    "Explain the difference between a list and a tuple in Python.",
    "Write a bash command that counts the lines in every .txt file in a folder.",
    "What is the capital of Australia, and why is it not Sydney?",
    "Give me tips for studying for an exam.",
    "Describe a sunset over the sea without using the word 'red'.",
)


def default_prompts(n: int, seed: int = 0, skip: int = 0) -> list[str]:
    """n prompts (at most len(TEMPLATES) * len(SUBJECTS) + len(SYSTEM_FREE) in all), the same for a seed;
    skip: leave out the first `skip` of that order (prompts a head was not trained on: skip its count)."""
    pool = [t.format(s=s) for t in TEMPLATES for s in SUBJECTS] + list(SYSTEM_FREE)
    random.Random(seed).shuffle(pool)
    return pool[skip:skip + n]
